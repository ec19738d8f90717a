// `memfit plan --max-model --ckpt POLICY`: the largest model of the family under that policy,
// every member planned with it, instead of each member's fastest (--ckpt unset or auto). The
// answer is at most the search's (whose candidates include the policy), the output names the
// policy, and a layers: list, which cannot hold at every depth, is refused. Kept fast with a
// small budget (GPT-2 at 1,024 tokens in 2 GiB: 4 layers keeping every activation, 10
// recomputing them; each search well under a second).
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

class MaxModelPolicy : public test::BinaryTest {
 protected:
  MaxModelPolicy() : BinaryTest(17) {}
  std::string args() const {
    return fmt::format("plan --max-model --model gpt2 --seq-len 1024 --batch 4 --attention "
                       "plain --mem-limit 2GiB --data '{}'",
                       (dir / "data").string());
  }
  // The --max-model JSON for `extra` options.
  nlohmann::json max_model(const std::string& extra) const {
    EXPECT_EQ(run_memfit(args() + " " + extra + " --json"), 0) << test::slurp(dir / "err.txt");
    return nlohmann::json::parse(test::slurp(dir / "out.txt"))["max_model"];
  }
};

TEST_F(MaxModelPolicy, AFixedPolicyIsPlannedForEveryMember) {
  const nlohmann::json open = max_model(""), none = max_model("--ckpt none"),
                       full = max_model("--ckpt full");
  EXPECT_EQ(open["ckpt"], "auto");
  EXPECT_EQ(none["ckpt"], "none");
  EXPECT_EQ(full["ckpt"], "full");
  ASSERT_TRUE(none["found"].get<bool>());
  EXPECT_EQ(none["best"]["ckpt"], "none");
  EXPECT_EQ(full["best"]["ckpt"], "full");
  for (const auto& n : full["neighbours"]) EXPECT_EQ(n["ckpt"], "full");
  const int any = open["best"]["n_layer"], kept = none["best"]["n_layer"],
            recomputed = full["best"]["n_layer"];
  // The search tries both policies with every member: its answer is at least each fixed one's,
  // and keeping every activation fits fewer layers than recomputing them.
  EXPECT_LE(kept, any);
  EXPECT_LE(recomputed, any);
  EXPECT_LT(kept, recomputed);
  // The text names the policy.
  ASSERT_EQ(run_memfit(args() + " --ckpt full"), 0);
  const std::string text = test::slurp(dir / "out.txt");
  EXPECT_NE(text.find("trains in 2048.0 MiB with --ckpt full is"), std::string::npos) << text;
}

TEST_F(MaxModelPolicy, ALayerListIsRefused) {
  EXPECT_EQ(run_memfit(args() + " --ckpt layers:0"), 2);
  EXPECT_NE(test::slurp(dir / "err.txt").find("layers: list"), std::string::npos)
      << test::slurp(dir / "err.txt");
}

}  // namespace
}  // namespace memfit
