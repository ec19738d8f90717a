// `memfit train --resume CKPT --steps N` with N above the checkpoint's --steps trains on (Note
// [Training longer] in docs/notes/checkpoints.md): the schedule is stretched over N steps, the
// run says so and that it is not bit-identical to an uninterrupted one, and the log continues
// with the new steps. Fewer --steps than the checkpoint's are refused, as before, and another
// rate with the same --steps goes ahead with its own warning, as before.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

class ResumeLonger : public test::BinaryTest {
 protected:
  ResumeLonger() : BinaryTest(19) {}
  std::string train(int steps, const std::string& extra = "") const {
    return fmt::format("train --model gpt2-tiny --seq-len 32 --batch 2 --threads 1 "
                       "--eval-batches 1 --data '{}' --save '{}' --log '{}' --steps {} {}",
                       (dir / "data").string(), (dir / "ck").string(),
                       (dir / "log.jsonl").string(), steps, extra);
  }
  std::vector<nlohmann::json> log() const {
    std::vector<nlohmann::json> lines;
    std::istringstream in(test::slurp(dir / "log.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss") && j.contains("lr")) lines.push_back(j);
    }
    return lines;
  }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

TEST_F(ResumeLonger, MoreStepsContinueOnAStretchedSchedule) {
  ASSERT_EQ(run_memfit(train(3)), 0) << err();
  const std::vector<nlohmann::json> first = log();
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(run_memfit(train(5, fmt::format("--resume '{}'", (dir / "ck").string()))), 0)
      << err();
  EXPECT_NE(err().find("training on from step 3 of a 3-step run to 5 steps: the learning-rate "
                       "schedule is stretched"),
            std::string::npos)
      << err();
  EXPECT_NE(err().find("not bit-identical to an uninterrupted 5-step run"), std::string::npos)
      << err();
  const std::vector<nlohmann::json> all = log();
  ASSERT_EQ(all.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(all[i]["step"].get<int>(), i + 1);
    EXPECT_TRUE(std::isfinite(all[i]["loss"].get<double>())) << all[i].dump();
  }
  EXPECT_EQ(all[2], first[2]);  // steps 1-3 are the first run's
  // Stretched: the 3-step cosine ended at its floor; step 4 of the 5-step one is above it.
  EXPECT_NEAR(all[2]["lr"].get<double>(), 6e-5, 1e-9);
  EXPECT_GT(all[3]["lr"].get<double>(), all[2]["lr"].get<double>());
  EXPECT_GT(all[3]["lr"].get<double>(), all[4]["lr"].get<double>());
  EXPECT_NEAR(all[4]["lr"].get<double>(), 6e-5, 1e-9);  // the new last step's floor
  const nlohmann::json state =
      nlohmann::json::parse(test::slurp(dir / "ck" / "trainer_state.json"));
  EXPECT_EQ(state["steps"], 5);
  EXPECT_EQ(state["step"], 5);
}

TEST_F(ResumeLonger, OtherScheduleChangesKeepTheirBehaviour) {
  ASSERT_EQ(run_memfit(train(3)), 0) << err();
  const std::string state = test::slurp(dir / "ck" / "trainer_state.json");
  const std::string resume = fmt::format("--resume '{}'", (dir / "ck").string());
  // Fewer steps: refused, nothing written.
  EXPECT_EQ(run_memfit(train(2, resume)), 2);
  EXPECT_NE(err().find("the checkpoint was trained with steps = 3, this run has 2"),
            std::string::npos)
      << err();
  EXPECT_EQ(test::slurp(dir / "ck" / "trainer_state.json"), state);
  // The same steps with another rate: goes ahead, saying it differs; no longer-run note.
  ASSERT_EQ(run_memfit(train(3, resume + " --lr 0.001")), 0) << err();
  EXPECT_NE(err().find("learning-rate schedule differs from the checkpoint's (lr 0.0006 -> "
                       "0.001)"),
            std::string::npos)
      << err();
  EXPECT_EQ(err().find("training on from step"), std::string::npos) << err();
}

}  // namespace
}  // namespace memfit
