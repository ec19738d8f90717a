// memfit's environment variables are checked at start (src/memfit/cli/environment.h): a misspelt
// value of MEMFIT_GEMM_KERNEL, MEMFIT_OFFLOAD_IO or MEMFIT_MAX_ISA stops any command with exit 2
// and a message naming the variable, before it writes anything, even a command that would never
// have read it (`memfit prepare` runs no GEMM; a run without offload starts no I/O engine).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <fmt/format.h>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::slurp;

class Environment : public test::BinaryTest {
 protected:
  Environment() : BinaryTest(7) {}
};

TEST_F(Environment, AMisspeltValueStopsAnyCommandBeforeItWrites) {
  fs::path text = dir / "a.txt";
  std::ofstream(text) << "The jury said it was a fine day.\n";
  // prepare multiplies nothing; train here offloads nothing.
  const std::string prepare = fmt::format("prepare --tokenizer byte --input '{}' --out '{}'",
                                          text.string(), (dir / "prepared").string());
  const std::string train = fmt::format(
      "train --model gpt2-tiny --data '{}' --batch 2 --seq-len 16 --steps 2 --save '{}'",
      (dir / "data").string(), (dir / "out").string());
  struct Case {
    const char* env;
    const char* variable;
  };
  for (const Case& c : {Case{"MEMFIT_GEMM_KERNEL=frist", "MEMFIT_GEMM_KERNEL"},
                        Case{"MEMFIT_OFFLOAD_IO=urnig", "MEMFIT_OFFLOAD_IO"},
                        Case{"MEMFIT_MAX_ISA=avx3", "MEMFIT_MAX_ISA"}}) {
    SCOPED_TRACE(c.env);
    EXPECT_EQ(run_memfit(prepare, 0, c.env), 2);
    EXPECT_NE(slurp(dir / "err.txt").find(c.variable), std::string::npos)
        << slurp(dir / "err.txt");
    EXPECT_FALSE(fs::exists(dir / "prepared"));
    EXPECT_EQ(run_memfit(train, 0, c.env), 2);
    EXPECT_NE(slurp(dir / "err.txt").find(c.variable), std::string::npos)
        << slurp(dir / "err.txt");
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
  // The values they take run (the control: the same commands succeed).
  EXPECT_EQ(run_memfit(train, 0, "MEMFIT_GEMM_KERNEL=first MEMFIT_OFFLOAD_IO=threads"), 0)
      << slurp(dir / "err.txt");
  EXPECT_TRUE(fs::exists(dir / "out"));
  EXPECT_EQ(run_memfit(prepare, 0, "MEMFIT_MAX_ISA=avx2"), 0) << slurp(dir / "err.txt");
  EXPECT_TRUE(fs::exists(dir / "prepared" / "dataset.json"));
}

}  // namespace
}  // namespace memfit
