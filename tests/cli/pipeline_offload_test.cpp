// --offload-optimizer (and --offload-params) under --pp, end to end under mpirun (Note [NVMe
// offload], "Under --pp"): each rank offloads its stage's state (its data rank's shard of it
// over several data ranks) into stage-<s>/ under its data rank's directory, and the update
// streams it after the norm over the stages. LLaMA: the losses, gradient norms and validation
// losses are the same --pp run's in RAM bit for bit; every world rank's plan is its measured
// peak by category, its files by category and its bytes read and written a step; nothing is
// left in --offload-dir.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineOffload : public test::PipelineBinaryTest {
 protected:
  PipelineOffload() : PipelineBinaryTest(4352) {}
  std::string off(bool params = false) const {
    return fmt::format(" --offload-optimizer nvme{} --offload-dir '{}'",
                       params ? " --offload-params nvme" : "", (dir / "off").string());
  }
};

// Micro-batches and clipping that binds (the norm over the stages before the streamed update).
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";
constexpr const char* kOneMicroBatch =
    "--steps 4 --grad-accum 1 --clip 0.05 --eval-every 2 --eval-batches 2";

TEST_F(PipelineOffload, OffloadedStateIsTheRunInRam) {
  for (const auto& [ranks, a, params] : std::vector<std::tuple<int, std::string, bool>>{
           {2, std::string(kSteps) + " --pp 2", false},
           {4, std::string(kSteps) + " --pp 4 --pp-schedule gpipe --precision bf16", false},
           {4, std::string(kSteps) + " --pp 2 --zero 1 --precision bf16", false},
           {2, std::string(kSteps) + " --pp 2 --precision bf16 --master-weights none", true},
           {4, std::string(kSteps) + " --pp 2 --zero 3", true},
           {2, std::string(kOneMicroBatch) + " --pp 2 --update-in-backward", false},
           // Stages of tensor groups: stage-<s>/tensor-<t>/.
           {4, std::string(kSteps) + " --pp 2 --tp 2 --sp --n-kv-head 1", false}}) {
    expect_close(train(ranks, a, "ram"), train(ranks, a + off(params), "off"),
                 {"loss", "grad_norm", "val_loss"}, 0, a + off(params));
    EXPECT_TRUE(!std::filesystem::exists(dir / "off") || std::filesystem::is_empty(dir / "off"))
        << a << ": files left behind";
  }
}

// --init-from a save: each stage's master weights written into its file from the whole
// tensors (load_by_layout), rounded into the working copy on the way, as in RAM.
TEST_F(PipelineOffload, InitFromASaveIsTheRunInRam) {
  train(0, fmt::format("--steps 2 --save '{}'", (dir / "ck").string()), "saved");
  const std::string init = fmt::format("{} --pp 2 --precision bf16 --init-from '{}'", kSteps,
                                       (dir / "ck").string());
  expect_close(train(2, init, "ram"), train(2, init + off(), "off"),
               {"loss", "grad_norm", "val_loss"}, 0, init + off());
}

TEST_F(PipelineOffload, ThePlanIsEveryRanksPeakFilesAndIo) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--grad-accum 4 --pp 2" + off()},
           {4, "--grad-accum 2 --pp 2 --zero 3 --precision bf16" + off(true)},
           {2, "--grad-accum 2 --pp 2 --precision bf16 --master-weights none" + off(true)},
           {2, "--grad-accum 1 --pp 2 --update-in-backward" + off()},
           {4, "--grad-accum 2 --pp 2 --tp 2" + off()}}) {
    const json plan = expect_plan_is_measured(ranks, "--steps 2 " + more);
    json measured;
    for (const json& j : lines(dir / "plan.jsonl"))
      if (j.contains("ranks")) measured = j["ranks"];
    ASSERT_EQ(measured.size(), size_t(ranks)) << more;
    for (int q = 0; q < ranks; ++q) {
      const json& p = plan["per_rank"][q];
      ASSERT_TRUE(p.contains("offload")) << more << ", rank " << q;
      ASSERT_TRUE(measured[q].contains("offload")) << more << ", rank " << q;
      EXPECT_GT(p["offload"]["disk_bytes"].get<uint64_t>(), 0u) << more;
      EXPECT_EQ(measured[q]["offload"]["disk"], p["offload"]["disk_by_category"])
          << more << ", rank " << q;
      EXPECT_EQ(measured[q]["offload"]["io_bytes_per_step"], p["offload"]["io_bytes_per_step"])
          << more << ", rank " << q;
    }
  }
}

TEST_F(PipelineOffload, RefusesWhatIsNotBuiltNamingIt) {
  auto refused = [&](const std::string& more, const std::string& says) {
    EXPECT_NE(run_memfit("plan " + args("--steps 2 --world-size 2 --pp 2" + more)), 0) << more;
    const std::string err = test::slurp(dir / "err.txt");
    EXPECT_NE(err.find(says), std::string::npos) << more << ": " << err;
  };
  refused(off() + " --offload-grads nvme", "--pp 2 with --offload-grads");
}

}  // namespace
}  // namespace memfit
