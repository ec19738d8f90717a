// memfit's help names both model families it trains: the program's and train's descriptions say
// GPT-2 and LLaMA, and no line of --help-all names GPT-2 alone (but the one about GPT-2's own
// tokenizer files), so GPT-2-only wording cannot creep back in.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "cli_test_util.h"

namespace memfit {
namespace {

class Help : public test::BinaryTest {
 protected:
  Help() : BinaryTest(5) {}
  std::string out() const { return test::slurp(dir / "out.txt"); }
};

TEST_F(Help, TheDescriptionsNameBothFamilies) {
  ASSERT_EQ(run_memfit("--help"), 0);
  EXPECT_NE(out().find("train GPT-2 and LLaMA-family language models within a memory budget"),
            std::string::npos)
      << out();
  EXPECT_NE(out().find("Train a GPT-2 or LLaMA-family model"), std::string::npos) << out();
  ASSERT_EQ(run_memfit("train --help"), 0);
  EXPECT_NE(out().find("Train a GPT-2 or LLaMA-family model"), std::string::npos) << out();
}

TEST_F(Help, NoLineNamesGpt2Alone) {
  ASSERT_EQ(run_memfit("--help-all"), 0);
  std::istringstream lines(out());
  int gpt2_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("GPT-2") == std::string::npos) continue;
    ++gpt2_lines;
    if (line.find("encoder.json") != std::string::npos) continue;  // GPT-2's tokenizer's files
    EXPECT_NE(line.find("LLaMA"), std::string::npos) << line;
  }
  EXPECT_GE(gpt2_lines, 3);  // the program, train, --init-from (the check saw them)
}

}  // namespace
}  // namespace memfit
