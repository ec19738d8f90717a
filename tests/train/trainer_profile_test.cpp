// train() with --profile: the losses are bit-identical to a run without it; trace.json is valid
// JSON of the documented shape whose pool.total maximum is the run's measured peak exactly and
// which has a slice for every phase of the step plan, for both families with and without
// recomputation; summary.json's measured peak is the planner's by category; the leak check
// names the test hook's deliberate leak by tag and finds none in a clean run.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "memfit/model/step_plan.h"
#include "memfit/train/trainer.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TrainerProfile : public test::TrainerFixture {
 protected:
  static json read_json(const fs::path& p) {
    std::ifstream in(p);
    return json::parse(in);
  }
};

TEST_F(TrainerProfile, ProfilingChangesNoLoss) {
  TrainConfig c = config();
  c.steps = 3;
  const TrainSummary plain = train(c);
  c.profile_dir = (dir / "profile").string();
  const TrainSummary profiled = train(c);
  ASSERT_EQ(plain.losses.size(), profiled.losses.size());
  EXPECT_EQ(std::memcmp(plain.losses.data(), profiled.losses.data(),
                        plain.losses.size() * sizeof(float)),
            0);
  EXPECT_EQ(std::memcmp(&plain.last_val_loss, &profiled.last_val_loss, sizeof(float)), 0);
  EXPECT_EQ(plain.peak_bytes, profiled.peak_bytes);  // the profiler allocates nothing in the pool
  EXPECT_TRUE(fs::exists(dir / "profile" / "trace.json"));
  EXPECT_FALSE(profiled.profile_text.empty());
}

void expect_trace_of(const TrainConfig& c, const TrainSummary& s, const fs::path& dir) {
  const json trace = json::parse(std::ifstream(dir / "trace.json"));
  ASSERT_TRUE(trace.is_object() && trace["traceEvents"].is_array());
  size_t total_max = 0;
  std::set<std::string> phases, slices;
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    if (e["ph"] == "C" && e["name"] == "pool.total")
      total_max = std::max(total_max, e["args"]["bytes"].get<size_t>());
    if (e["ph"] == "X" && e["cat"] == "phase") phases.insert(e["name"]);
    if (e["ph"] == "X" && e["cat"] != "phase" && e["pid"] == 1) slices.insert(e["cat"]);
  }
  EXPECT_EQ(total_max, s.peak_bytes) << c.model << " " << c.ckpt;
  const StepPlan plan = plan_step(c.model_config(), c.batch, c.seq_len, c.activation_options());
  for (const Phase& p : plan.phases) EXPECT_TRUE(phases.count(p.name())) << p.name() << " " << c.ckpt;
  for (const char* k : {"step", "micro-batch", "data", "optimizer", "evaluation"})
    EXPECT_TRUE(slices.count(k)) << k;

  const json summary = json::parse(std::ifstream(dir / "summary.json"));
  EXPECT_EQ(summary["measured"]["peak_bytes"], s.peak_bytes);
  EXPECT_EQ(summary["measured"]["by_category"], summary["planned"]["by_category"]);
  EXPECT_EQ(summary["profile"]["steps"], json::array({1, c.profile_steps}));
  EXPECT_EQ(summary["profile"]["pool_events_dropped"], 0);
}

TEST_F(TrainerProfile, TraceHasThePeakAndEveryPhaseInBothFamilies) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const char* ckpt : {"none", "full"}) {
      TrainConfig c = config(model);
      c.steps = 3;
      c.ckpt = ckpt;
      c.profile_dir = (dir / fmt::format("{}-{}", model, ckpt)).string();
      c.profile_steps = 3;  // the evaluation at step 3 is in it
      const TrainSummary s = train(c);
      expect_trace_of(c, s, c.profile_dir);
    }
}

TEST_F(TrainerProfile, LeakCheckNamesTheTestHooksLeakByTag) {
  TrainConfig c = config();
  c.steps = 4;
  c.test_leak_bytes = 1000;
  c.profile_dir = (dir / "profile").string();
  const TrainSummary s = train(c);
  ASSERT_TRUE(s.leak.leaked()) << s.leak.text();
  ASSERT_EQ(s.leak.grew.size(), 1u);
  EXPECT_EQ(s.leak.grew[0].tag, "test.leak");
  EXPECT_EQ(s.leak.grew[0].category, Category::workspace);
  EXPECT_EQ(s.leak.grew[0].first_grew_after, 2);
  EXPECT_EQ(s.leak.grew[0].last_bytes, 3 * 1024u);  // 3 steps of 1000 bytes, rounded to 64
  EXPECT_NE(s.leak.text().find("test.leak (workspace)"), std::string::npos) << s.leak.text();
  const json leak = read_json(dir / "profile" / "leak.json");
  EXPECT_TRUE(leak["leaked"]);
  EXPECT_EQ(leak["grew"][0]["tag"], "test.leak");
}

TEST_F(TrainerProfile, CleanRunHasNoLeak) {
  TrainConfig c = config("llama-tiny");
  c.steps = 4;
  const TrainSummary s = train(c);
  EXPECT_FALSE(s.leak.leaked()) << s.leak.text();
  EXPECT_EQ(s.leak.boundaries, 4);
  EXPECT_TRUE(s.profile_text.empty());
}

}  // namespace
}  // namespace memfit
