// Saves and resumes with the optimizer state (and the working weights) offloaded under --pp,
// through the built binary under mpirun (Note [NVMe offload], "Under --pp"; Note [Checkpoints
// across layouts]): each rank streams its stage's part out of its files in stage-<s>/ into the
// whole tensors (TrainRun::write_offloaded_part), and a resume reads each piece through the
// layout map into them (io::LayoutStateReader). The offloaded save is the in-RAM run's save
// byte for byte (pp 2; a tied GPT-2 at pp 2; bf16 pp 2 x tp 2; dp 2 x pp 2 at ZeRO 3 with
// --offload-params; pure bf16 with --offload-params; interleaved, each chunk from its files); a
// resume of it at pp 2, offloaded, continues the in-RAM run that never stopped bit for bit;
// pp 2 offloaded -> one process offloaded -> pp 4 offloaded gives the same files; the saving run's plan is every rank's
// measured peak. Skips where memfit was built without MPI.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class PipelineOffloadCheckpoint : public test::PipelineBinaryTest {
 protected:
  PipelineOffloadCheckpoint() : PipelineBinaryTest(4717) {}
  std::string off(bool params = false) const {
    return fmt::format(" --offload-optimizer nvme{} --offload-dir '{}'",
                       params ? " --offload-params nvme" : "", (dir / "off").string());
  }
  std::string path(const char* name) const { return (dir / name).string(); }
  // Two checkpoints' weights, optimizer state and config.json: the same bytes.
  void same(const char* x, const char* y, const std::string& what) const {
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"}) {
      const std::string a = test::slurp(dir / x / f), b = test::slurp(dir / y / f);
      EXPECT_FALSE(a.empty()) << what << ": " << x << "/" << f;
      EXPECT_TRUE(a == b) << what << ": " << x << "/" << f << " differs from " << y << "'s";
    }
  }
  void no_files_left(const std::string& what) const {
    EXPECT_TRUE(!fs::exists(dir / "off") || fs::is_empty(dir / "off"))
        << what << ": files left behind";
  }
  // The resumed run's steps (3 and 4) are those of the run that never stopped, bit for bit.
  static void expect_continues(const std::vector<json>& whole, const std::vector<json>& resumed) {
    int compared = 0;
    for (const json& r : numbers(resumed)) {
      if (!r.contains("loss")) continue;
      EXPECT_GT(r["step"].get<int64_t>(), 2) << r;
      for (const json& w : numbers(whole))
        if (w.contains("loss") && w["step"] == r["step"]) {
          EXPECT_EQ(w["loss"].get<double>(), r["loss"].get<double>()) << r;
          EXPECT_EQ(w["grad_norm"].get<double>(), r["grad_norm"].get<double>()) << r;
          ++compared;
        }
    }
    EXPECT_EQ(compared, 2);
  }
};

// Two steps of four, then a save; clipping that binds, two micro-batches through the stages.
constexpr const char* kTwo = "--steps 4 --stop-after 2 --grad-accum 2 --clip 0.05";

TEST_F(PipelineOffloadCheckpoint, OffloadedSaveIsTheInRamSave) {
  for (const auto& [ranks, a, params] : std::vector<std::tuple<int, std::string, bool>>{
           {2, "--pp 2", false},
           // The tied table: the first stage's copy written, the last stage's not.
           {2, "--model gpt2-tiny --vocab 520 --pp 2", false},
           {4, "--pp 2 --tp 2 --precision bf16", false},
           {4, "--pp 2 --zero 3", true},
           {2, "--pp 2 --precision bf16 --master-weights none", true}}) {
    const std::string run = std::string(kTwo) + " " + a;
    train(ranks, fmt::format("{} --save '{}'", run, path("ram")), "ram");
    train(ranks, fmt::format("{} --save '{}'", run, path("off_save")) + off(params), "off");
    same("ram", "off_save", run + off(params));
    no_files_left(run);
    fs::remove_all(dir / "ram");
    fs::remove_all(dir / "off_save");
  }
}

TEST_F(PipelineOffloadCheckpoint, ResumesTheRunInRamAndRoundTripsAcrossLayouts) {
  train(2, fmt::format("{} --pp 2 --save '{}'", kTwo, path("p2")) + off(), "p2");
  // Resumed offloaded at its own layout: the in-RAM run that never stopped, bit for bit.
  const std::string on = "--steps 4 --grad-accum 2 --clip 0.05 --pp 2";
  const auto whole = train(2, on, "whole");
  expect_continues(whole,
                   train(2, fmt::format("{} --resume '{}'", on, path("p2")) + off(), "resumed"));
  // pp 2 offloaded -> one process offloaded -> pp 4 offloaded, no step between: the same files.
  const std::string again = "--steps 4 --stop-after 2 --grad-accum 2 --clip 0.05";
  train(0, fmt::format("{} --resume '{}' --save '{}'", again, path("p2"), path("p1")) + off(),
        "p1");
  train(4, fmt::format("{} --pp 4 --resume '{}' --save '{}'", again, path("p1"), path("p4")) +
               off(),
        "p4");
  same("p2", "p1", "pp 2 -> one process");
  same("p1", "p4", "one process -> pp 4");
  no_files_left("round trip");
}

// --pp-schedule interleaved: each chunk's part streamed from its own files (stage-<c P + r>/)
// into the whole tensors, the in-RAM interleaved save byte for byte (and with the working
// weights on disk, no master weights); resumed offloaded, each chunk's state read into its
// files, the in-RAM run that never stopped, bit for bit. The saving run's plan is every rank's
// measured peak (one save staging a rank, its chunks written one after another).
TEST_F(PipelineOffloadCheckpoint, InterleavedChunksSaveFromTheirFilesAndResume) {
  const std::string iv = " --pp 2 --pp-schedule interleaved --pp-virtual 2";
  const std::string run = kTwo + iv;
  train(2, fmt::format("{} --save '{}'", run, path("ram")), "ram");
  train(2, fmt::format("{} --save '{}'", run, path("off_save")) + off(), "off");
  same("ram", "off_save", run + off());
  no_files_left(run);
  const std::string pure = run + " --precision bf16 --master-weights none";
  train(2, fmt::format("{} --save '{}'", pure, path("pure_ram")), "pure_ram");
  train(2, fmt::format("{} --save '{}'", pure, path("pure_off")) + off(true), "pure_off");
  same("pure_ram", "pure_off", pure + off(true));
  no_files_left(pure);
  const std::string on = "--steps 4 --grad-accum 2 --clip 0.05" + iv;
  expect_continues(train(2, on, "whole"),
                   train(2, fmt::format("{} --resume '{}'", on, path("off_save")) + off(),
                         "resumed"));
  no_files_left("resumed");
  const json plan = expect_plan_is_measured(
      2, fmt::format("--steps 2 --grad-accum 2 --save '{}'", path("ck")) + iv + off());
  EXPECT_EQ(plan["per_rank"].size(), 2u);
}

// The saving run's plan: every world rank's peak by category (the ring and the save's
// staging), and its files.
TEST_F(PipelineOffloadCheckpoint, ThePlanOfTheSavingRunIsMeasured) {
  const json plan = expect_plan_is_measured(
      2, fmt::format("--steps 2 --grad-accum 2 --pp 2 --save '{}'", path("ck")) + off());
  json measured;
  for (const json& j : lines(dir / "plan.jsonl"))
    if (j.contains("ranks")) measured = j["ranks"];
  ASSERT_EQ(measured.size(), 2u);
  for (int q = 0; q < 2; ++q)
    EXPECT_EQ(measured[q]["offload"]["disk"], plan["per_rank"][q]["offload"]["disk_by_category"])
        << "rank " << q;
}

}  // namespace
}  // namespace memfit
