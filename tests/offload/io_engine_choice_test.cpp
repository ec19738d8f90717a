// Which I/O engine make_io_engine starts, by MEMFIT_OFFLOAD_IO: "threads" forces the pread/pwrite
// threads, unset or "uring" tries io_uring first (falling back to the threads where it cannot
// start), and any other value is a ConfigError that names the variable and what it takes,
// rather than a silent default.
#include "memfit/offload/io_engine.h"

#include <gtest/gtest.h>

#include <string>

#include "memfit/core/error.h"
#include "../support/scoped_env.h"

namespace memfit::offload {
namespace {

// MEMFIT_OFFLOAD_IO for one scope (nullptr: unset), restored after.
test::ScopedEnv io_env(const char* value) { return {"MEMFIT_OFFLOAD_IO", value}; }

TEST(IoEngineChoice, ThreadsAreForcedAndTheDefaultTriesIoUring) {
  {
    const auto env = io_env("threads");
    EXPECT_EQ(make_io_engine()->name(), "threads");
  }
  for (const char* v : {static_cast<const char*>(nullptr), "", "uring"}) {
    const auto env = io_env(v);
    std::string why;
    const bool uring_starts = make_uring_engine(&why) != nullptr;
    EXPECT_EQ(make_io_engine()->name(), uring_starts ? "io_uring" : "threads")
        << (v ? v : "(unset)") << ": " << why;
  }
}

TEST(IoEngineChoice, AnUnknownValueIsAConfigErrorNamingTheVariable) {
  const auto env = io_env("iouring");
  try {
    make_io_engine();
    FAIL() << "MEMFIT_OFFLOAD_IO=iouring was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MEMFIT_OFFLOAD_IO"), std::string::npos) << what;
    EXPECT_NE(what.find("'iouring'"), std::string::npos) << what;
    EXPECT_NE(what.find("threads"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace memfit::offload
