// The trainer lets go of everything a step, an evaluation or a save allocates: the pool's live
// bytes at every step boundary of a short run with evaluations and saves equal those after the
// first step (which allocated the optimizer state). A leak fails with the categories that grew.
// The long form, with RSS, is the soak benchmark (bench/e2e/soak.py).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/cli/options/train_from_config.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

using nlohmann::json;

class TrainerLeak : public test::TrainerFixture {};

// "params +4096 B, optimizer +128 B": the categories of `now` that hold more than in `first`.
std::string grown(const json& first, const json& now) {
  std::string out;
  for (const auto& [category, bytes] : now.items()) {
    const int64_t before = first.value(category, int64_t{0}), after = bytes.get<int64_t>();
    if (after > before)
      out += fmt::format("{}{} +{} B", out.empty() ? "" : ", ", category, after - before);
  }
  return out.empty() ? "no category (the total only)" : out;
}

TEST_F(TrainerLeak, LiveBytesAtStepBoundariesStayAtTheFirstStepsOverEvalsAndSaves) {
  TrainConfig c = config();
  c.steps = 30;
  c.eval_every = 5;
  c.save_every = 5;
  c.save_dir = (dir / "ck").string();
  c.log_file = (dir / "log.jsonl").string();
  const TrainSummary summary = train(c);
  // The trainer's own leak check (profile/leak_check.h) agrees.
  EXPECT_FALSE(summary.leak.leaked()) << summary.leak.text();
  EXPECT_EQ(summary.leak.boundaries, 30);

  std::vector<json> steps, saves;
  for (const json& j : read_log(c.log_file)) {
    if (j.contains("loss")) steps.push_back(j);
    if (j.contains("saved")) saves.push_back(j);
  }
  ASSERT_EQ(steps.size(), 30u);
  ASSERT_EQ(saves.size(), 6u);  // steps 5, 10, ..., 25 and the final one at 30
  const json& first = steps.front();
  ASSERT_TRUE(first.contains("live_bytes") && first.contains("rss_bytes") &&
              first.contains("outside_pool_bytes"))
      << first.dump();
  for (const json& j : steps) {
    EXPECT_EQ(j["live_bytes"], first["live_bytes"])
        << "step " << j["step"] << ": live bytes grew since step 1 in "
        << grown(first["mem"], j["mem"]);
    EXPECT_EQ(j["live_allocations"], first["live_allocations"]) << "step " << j["step"];
  }
  for (const json& j : saves)
    EXPECT_EQ(j["live_bytes"], saves.front()["live_bytes"])
        << "after the save of step " << j["step"] << ": " << grown(saves.front()["mem"], j["mem"]);
  // A save holds nothing once written: the bytes live after it are those of the step before.
  EXPECT_EQ(saves.front()["live_bytes"], first["live_bytes"])
      << grown(first["mem"], saves.front()["mem"]);
}

}  // namespace
}  // namespace memfit
