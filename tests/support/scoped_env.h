// One environment variable set (or unset) for a scope and restored on leaving it, whatever was
// there before, also when an assertion, a FAIL() or an exception leaves the scope early. Tests
// that set memfit's switches (MEMFIT_OFFLOAD_IO, MEMFIT_CACHE_DIR, MEMFIT_OFFLOAD_FAIL_IO, ...)
// by hand leaked them into the tests after them on any early exit, and cleared a value the
// caller had set (CI runs the suite with MEMFIT_CACHE_DIR pointing into the build tree).
// Shared by the test executables of every module; its own test is scoped_env_test.cpp.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace memfit::test {

class ScopedEnv {
 public:
  // `value` nullptr unsets the variable for the scope.
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) before_ = old;
    set(value);
  }
  ScopedEnv(std::string name, const std::string& value) : ScopedEnv(std::move(name), value.c_str()) {}
  ~ScopedEnv() { set(before_ ? before_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // Sets another value within the same scope (nullptr: unset); the destructor still restores
  // the value from before the scope.
  void set(const char* value) const {
    if (value)
      ::setenv(name_.c_str(), value, 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> before_;
};

}  // namespace memfit::test
