// `memfit plan --mem-limit` scripts: exit 0 when the run fits (some candidate of a search, some
// member for --max-model), 3 when it does not, after the same output, text or JSON; so
// `memfit plan ... && memfit train ...` trains only what fits.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

class PlanExitCode : public test::BinaryTest {
 protected:
  PlanExitCode() : BinaryTest(7) {}
  // gpt2-tiny with 4 blocks and plain attention, on this test's shards (as PlannerCommands).
  std::string model() const {
    return fmt::format("--model gpt2-tiny --n-layer 4 --seq-len 32 --batch 4 --grad-accum 2 "
                       "--attention plain --eval-batches 1 --data '{}'",
                       (dir / "data").string());
  }
  int plan(const std::string& args) const { return run_memfit("plan " + model() + " " + args); }
  std::string out() const { return test::slurp(dir / "out.txt"); }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

TEST_F(PlanExitCode, AFixedRunExits3WhenItDoesNotFit) {
  ASSERT_EQ(plan("--ckpt none --mem-limit 1GiB"), 0) << err();
  EXPECT_NE(out().find("fits, "), std::string::npos) << out();
  EXPECT_EQ(plan("--ckpt none --mem-limit 1KiB"), 3) << err();
  EXPECT_NE(out().find("does NOT fit"), std::string::npos) << out();
  // The JSON is printed whole before the exit.
  EXPECT_EQ(plan("--ckpt none --mem-limit 1KiB --json"), 3) << err();
  EXPECT_FALSE(nlohmann::json::parse(out())["fits"].get<bool>());
  // No budget: nothing to fit, exit 0.
  EXPECT_EQ(plan("--ckpt none"), 0) << err();
}

TEST_F(PlanExitCode, ASearchExits3WhenNoCandidateFits) {
  ASSERT_EQ(plan("--auto --mem-limit 1GiB"), 0) << err();
  EXPECT_NE(out().find("the chosen run:"), std::string::npos) << out();
  EXPECT_EQ(plan("--auto --mem-limit 1KiB"), 3) << err();
  EXPECT_NE(out().find("the smallest footprint:"), std::string::npos) << out();
  EXPECT_EQ(plan("--ckpt auto --mem-limit 1KiB --json"), 3) << err();
  EXPECT_FALSE(nlohmann::json::parse(out())["search"]["fits"].get<bool>());
  // --max-model: no member of the family fits 1 KiB; a 64 MiB budget holds gpt2-tiny's family's
  // smallest members.
  const std::string max_model = fmt::format(
      "plan --max-model --model gpt2-tiny --seq-len 32 --batch 2 --data '{}' --mem-limit ",
      (dir / "data").string());
  EXPECT_EQ(run_memfit(max_model + "1KiB"), 3) << err();
  EXPECT_NE(out().find("no GPT-2-family model trains"), std::string::npos) << out();
  EXPECT_EQ(run_memfit(max_model + "64MiB"), 0) << err();
  EXPECT_NE(out().find("the largest GPT-2-family model"), std::string::npos) << out();
}

}  // namespace
}  // namespace memfit
