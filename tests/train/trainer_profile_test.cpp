// train() with --profile: the losses are bit-identical to a run without it; trace.json is valid
// JSON of the documented shape whose pool.total maximum is the run's measured peak exactly and
// which has a slice for every phase of the step plan, for both families with and without
// recomputation; summary.json's measured peak is the planner's by category; the leak check
// names the test hook's deliberate leak by tag and finds none in a clean run. With the optimizer
// offloaded, the trace has a disk.<category> track of the planner's disk bytes and an io slice
// (the update waiting on the disk) inside every profiled optimizer slice; without, neither.
// LoRA profiles its step as any run does.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/model/step_plan.h"
#include "memfit/plan/memory_plan.h"
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
    // Not offloaded: no disk tier, no waits on it.
    EXPECT_FALSE(e["ph"] == "C" && e["name"].get<std::string>().starts_with("disk.")) << e.dump();
  }
  EXPECT_FALSE(slices.count("io"));
  EXPECT_EQ(total_max, s.peak_bytes) << c.model << " " << c.ckpt;
  const RunSpec spec = resolve_run(c);
  const StepPlan plan = plan_step(spec.model, c.batch, c.seq_len, spec.activation_options());
  for (const Phase& p : plan.phases) EXPECT_TRUE(phases.count(p.name())) << p.name() << " " << c.ckpt;
  for (const char* k : {"step", "micro-batch", "data", "optimizer", "evaluation"})
    EXPECT_TRUE(slices.count(k)) << k;

  const json summary = json::parse(std::ifstream(dir / "summary.json"));
  EXPECT_EQ(summary["measured"]["peak_bytes"], s.peak_bytes);
  EXPECT_EQ(summary["measured"]["by_category"], summary["planned"]["by_category"]);
  EXPECT_EQ(summary["profile"]["steps"], json::array({1, c.profile_steps}));
  EXPECT_EQ(summary["profile"]["pool_events_dropped"], 0);
  EXPECT_FALSE(summary.contains("disk"));
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

// LoRA (Note [LoRA], "The profiler"): profiling changes no loss, the trace's peak is the
// measured one and has every phase of the LoRA step plan, summary.json's measured bytes are the
// plan's by category (the adapters' weights, gradients and optimizer state), and no leak; fp32
// GPT-2 and bf16 LLaMA, with dropout.
TEST_F(TrainerProfile, LoraProfilesItsStepInBothFamilies) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    TrainConfig c = config(model);
    c.steps = 3;
    c.lora.rank = 4;
    c.lora.dropout = 0.1f;
    if (std::string(model) == "llama-tiny") c.precision = "bf16";
    const TrainSummary plain = train(c);
    c.profile_dir = (dir / fmt::format("lora-{}", model)).string();
    c.profile_steps = 3;
    const TrainSummary s = train(c);
    ASSERT_EQ(plain.losses.size(), s.losses.size());
    EXPECT_EQ(std::memcmp(plain.losses.data(), s.losses.data(), s.losses.size() * sizeof(float)),
              0)
        << model;
    EXPECT_EQ(plain.peak_bytes, s.peak_bytes) << model;
    expect_trace_of(c, s, c.profile_dir);
    const json summary = read_json(fs::path(c.profile_dir) / "summary.json");
    EXPECT_GT(summary["measured"]["by_category"].value("grads", size_t{0}), 0u) << model;
    EXPECT_FALSE(s.leak.leaked()) << s.leak.text();
  }
}

TEST_F(TrainerProfile, OffloadShowsTheDiskTierAndTheWaitsOnIt) {
  TrainConfig c = config();
  c.precision = "bf16";  // master weights too: two disk categories
  c.offload_optimizer = "nvme";
  c.offload_dir = (dir / "offload").string();
  c.steps = 3;
  c.profile_steps = 2;
  c.profile_dir = (dir / "profile").string();
  const PlanReport plan = plan_training(resolve_run(c));
  train(c);
  const json trace = read_json(dir / "profile" / "trace.json");

  std::map<std::string, std::set<size_t>> disk;  // track -> its values
  std::vector<std::pair<double, double>> optimizer, io;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "C" && e["name"].get<std::string>().starts_with("disk."))
      disk[e["name"]].insert(e["args"]["bytes"].get<size_t>());
    if (e["ph"] != "X" || e["pid"] != 1) continue;
    const double t0 = e["ts"], t1 = t0 + e["dur"].get<double>();
    if (e["cat"] == "optimizer") optimizer.push_back({t0, t1});
    if (e["cat"] == "io") {
      EXPECT_EQ(e["name"], "io wait");
      io.push_back({t0, t1});
    }
  }
  std::map<std::string, std::set<size_t>> want;
  for (Category cat : kAllCategories)
    if (const size_t b = plan.disk_by_category[static_cast<size_t>(cat)])
      want["disk." + std::string(category_name(cat))] = {b};
  EXPECT_EQ(want.size(), 2u);  // master and optimizer
  EXPECT_EQ(disk, want);

  // Every profiled step's update waited on the disk at least once, inside its optimizer slice,
  // and every wait is inside one (microseconds as doubles: a nanosecond's slack for rounding).
  ASSERT_EQ(optimizer.size(), 2u);
  for (const auto& [o0, o1] : optimizer) {
    int inside = 0;
    for (const auto& [w0, w1] : io) inside += w0 >= o0 - 1e-3 && w1 <= o1 + 1e-3;
    EXPECT_GE(inside, 1);
  }
  for (const auto& [w0, w1] : io) {
    bool in_one = false;
    for (const auto& [o0, o1] : optimizer) in_one |= w0 >= o0 - 1e-3 && w1 <= o1 + 1e-3;
    EXPECT_TRUE(in_one) << w0;
  }

  // summary.json: the files' bytes against the plan's, by category.
  const json summary = read_json(dir / "profile" / "summary.json");
  ASSERT_TRUE(summary.contains("disk")) << summary.dump();
  EXPECT_EQ(summary["disk"]["files_bytes"], plan.disk_bytes);
  EXPECT_EQ(summary["disk"]["planned_bytes"], plan.disk_bytes);
  for (const auto& [track, bytes] : want) {
    const json& cat = summary["disk"]["by_category"][track.substr(5)];
    EXPECT_EQ(cat["files"], *bytes.begin()) << track;
    EXPECT_EQ(cat["planned"], *bytes.begin()) << track;
  }
  EXPECT_GT(summary["slices"]["io"]["count"].get<int>(), 1);
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
