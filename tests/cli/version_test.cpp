// `memfit --version`: memfit's version and git commit, the compiler, oneDNN's and Highway's
// versions and the kernels' dispatch target, one field a line, exit 0; the target follows
// MEMFIT_MAX_ISA.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "cli_test_util.h"

namespace memfit {
namespace {

class Version : public test::BinaryTest {
 protected:
  Version() : BinaryTest(3) {}
  std::string out() const { return test::slurp(dir / "out.txt"); }
};

TEST_F(Version, PrintsEveryField) {
  ASSERT_EQ(run_memfit("--version"), 0) << test::slurp(dir / "err.txt");
  const std::string v = out();
  // The commit: 12 hex digits (with -dirty for a tree with changes), or unknown outside git.
  EXPECT_TRUE(std::regex_search(
      v, std::regex(R"(^memfit \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)\n)")))
      << v;
  EXPECT_TRUE(
      std::regex_search(v, std::regex(R"(\ncompiler: (GCC|clang) \d+\.\d+\.\d+, C\+\+\d\d\n)")))
      << v;
  EXPECT_TRUE(std::regex_search(v, std::regex(R"(\noneDNN: \d+\.\d+\.\d+ \(commit .+\)\n)"))) << v;
  EXPECT_TRUE(std::regex_search(v, std::regex(R"(\nHighway: \d+\.\d+\.\d+\n)"))) << v;
  EXPECT_TRUE(std::regex_search(
      v, std::regex(R"(\nCPU: .+: (scalar|avx2|avx512|avx512_bf16|amx)(, capped to \w+ by )"
                    R"(MEMFIT_MAX_ISA)?; kernels' dispatch target [A-Z0-9_]+\n)")))
      << v;
}

TEST_F(Version, TheTargetFollowsTheCap) {
  ASSERT_EQ(run_memfit("--version", 0, "MEMFIT_MAX_ISA=scalar"), 0);
  const std::string v = out();
  EXPECT_TRUE(v.find("kernels' dispatch target SCALAR") != std::string::npos ||
              v.find("kernels' dispatch target EMU128") != std::string::npos)
      << v;
  EXPECT_NE(v.find("capped to scalar by MEMFIT_MAX_ISA"), std::string::npos) << v;
}

}  // namespace
}  // namespace memfit
