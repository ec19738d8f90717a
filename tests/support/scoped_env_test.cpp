// test::ScopedEnv (scoped_env.h), which every test that sets one of memfit's environment
// switches goes through: it restores the value from before the scope, or its absence, also
// when the scope is left by an exception.
#include "scoped_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace memfit::test {
namespace {

constexpr const char* kName = "MEMFIT_SCOPED_ENV_TEST";

std::string value() {
  const char* v = std::getenv(kName);
  return v ? v : "(unset)";
}

TEST(ScopedEnv, RestoresTheValueFromBefore) {
  ::setenv(kName, "before", 1);
  {
    const ScopedEnv env(kName, "inside");
    EXPECT_EQ(value(), "inside");
    env.set("again");
    EXPECT_EQ(value(), "again");
    env.set(nullptr);
    EXPECT_EQ(value(), "(unset)");
  }
  EXPECT_EQ(value(), "before");
  ::unsetenv(kName);
}

TEST(ScopedEnv, RestoresAnUnsetVariable) {
  ::unsetenv(kName);
  {
    const ScopedEnv env(kName, std::string("inside"));
    EXPECT_EQ(value(), "inside");
  }
  EXPECT_EQ(value(), "(unset)");
  {
    const ScopedEnv env(kName, nullptr);  // unset for the scope: stays unset
    EXPECT_EQ(value(), "(unset)");
  }
  EXPECT_EQ(value(), "(unset)");
}

TEST(ScopedEnv, RestoresWhenAnExceptionLeavesTheScope) {
  ::setenv(kName, "before", 1);
  try {
    const ScopedEnv env(kName, nullptr);
    EXPECT_EQ(value(), "(unset)");
    throw std::runtime_error("leaving early");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(value(), "before");
  ::unsetenv(kName);
}

}  // namespace
}  // namespace memfit::test
