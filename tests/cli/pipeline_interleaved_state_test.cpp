// --pp-schedule interleaved with the state on disk and with per-micro-batch sync, end to end
// under mpirun (Note [Pipeline parallel], "Interleaved"; Note [NVMe offload], "Under --pp"):
// each of a rank's chunks offloads its own state into stage-<virtual stage>/ under its data
// rank's directory and streams it in the update after the norm over every virtual stage, so
// the losses, gradient norms and validation losses are the in-RAM interleaved run's bit for
// bit (clipping that binds; the working weights on disk too; two data ranks at ZeRO 3; two
// tensor ranks);
// --sync-every-micro-batch at ZeRO 1 over two data ranks is ZeRO 2's bits. Every world rank's
// plan is its measured peak by category, its files by category and its bytes read and written
// a step, and its collectives. --update-in-backward is refused naming why. Skips where memfit
// was built without MPI.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineInterleavedState : public test::PipelineBinaryTest {
 protected:
  PipelineInterleavedState() : PipelineBinaryTest(4354) {}
  std::string off(bool params = false) const {
    return fmt::format(" --offload-optimizer nvme{} --offload-dir '{}'",
                       params ? " --offload-params nvme" : "", (dir / "off").string());
  }
};

constexpr const char* kIv = " --pp 2 --pp-schedule interleaved --pp-virtual 2";
// Four micro-batches, clipping that binds (the norm over every virtual stage decides it before
// any chunk's streamed update), a validation loss every two steps.
constexpr const char* kSteps =
    "--steps 3 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";

TEST_F(PipelineInterleavedState, OffloadedStateIsTheRunInRam) {
  for (const auto& [ranks, more, params] : std::vector<std::tuple<int, std::string, bool>>{
           {2, "", false},
           {2, " --precision bf16 --master-weights none", true},
           {4, " --zero 3", true},
           // Stages of tensor groups: stage-<virtual stage>/tensor-<t>/.
           {4, " --tp 2 --n-kv-head 1", false}}) {
    const std::string a = std::string(kSteps) + kIv + more;
    expect_close(train(ranks, a, "ram"), train(ranks, a + off(params), "off"),
                 {"loss", "grad_norm", "val_loss"}, 0, a + off(params), 6);
    EXPECT_TRUE(!std::filesystem::exists(dir / "off") || std::filesystem::is_empty(dir / "off"))
        << a << ": files left behind";
  }
}

// --init-from a save: each chunk's master weights written into its file from the whole tensors
// (load_chunk_by_layout), rounded into the working copy on the way, as in RAM.
TEST_F(PipelineInterleavedState, InitFromASaveIsTheRunInRam) {
  train(0, fmt::format("--steps 2 --save '{}'", (dir / "ck").string()), "saved");
  const std::string init = fmt::format("{}{} --precision bf16 --init-from '{}'", kSteps, kIv,
                                       (dir / "ck").string());
  expect_close(train(2, init, "ram"), train(2, init + off(), "off"),
               {"loss", "grad_norm", "val_loss"}, 0, init + off(), 6);
}

// Every chunk's files are its own: rank r's are stage-r/ and stage-(P + r)/ (under its data
// rank's rank-<d>/ over several), counted together in the plan's files and I/O a step.
TEST_F(PipelineInterleavedState, ThePlanIsEveryRanksPeakFilesAndIo) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, std::string("--grad-accum 2") + kIv + off()},
           {2, std::string("--grad-accum 2 --precision bf16 --master-weights none") + kIv +
                   off(true)},
           {4, std::string("--grad-accum 2 --zero 3 --precision bf16") + kIv + off(true)}}) {
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

// --sync-every-micro-batch (Note [ZeRO], "Bit-identity of stages 0-2"): each chunk's data ranks
// reduce every micro-batch unit by unit into a whole accumulator, as ZeRO 2 reduces into its
// shards, so ZeRO 1 with the flag is ZeRO 2's bits; the plan is every rank's peak and its
// collectives (rank 0's chunks' together) the log's.
TEST_F(PipelineInterleavedState, SyncEveryMicroBatchIsStageTwosBits) {
  const std::string a = std::string(kSteps) + kIv;
  expect_close(train(4, a + " --zero 2", "zero2"),
               train(4, a + " --zero 1 --sync-every-micro-batch", "sync"),
               {"loss", "grad_norm", "val_loss"}, 0, "dp 2 x pp 2 V 2 --zero 1 --sync-every-micro-batch",
               6);
  const std::string p = std::string("--steps 2 --grad-accum 2 --zero 1 --sync-every-micro-batch") + kIv;
  const json plan = expect_plan_is_measured(4, p);
  int steps = 0;
  for (const json& j : lines(dir / "plan.jsonl")) {
    if (!j.contains("loss")) continue;
    ++steps;
    for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
      EXPECT_EQ(j["comm_bytes"][c], plan["stages"][0]["comm_per_step"][c]) << c;
  }
  EXPECT_EQ(steps, 2);
}

TEST_F(PipelineInterleavedState, RefusesWhatIsNotBuiltNamingIt) {
  auto refused = [&](const std::string& more, const std::string& says) {
    EXPECT_NE(run_memfit("plan " + args("--steps 2 --world-size 2" + std::string(kIv) + more)),
              0)
        << more;
    const std::string err = test::slurp(dir / "err.txt");
    EXPECT_NE(err.find(says), std::string::npos) << more << ": " << err;
  };
  // The fused update steps a unit as the step's one backward of it ends (--grad-accum 1);
  // interleaved's micro-batches come in groups of --pp.
  refused(" --grad-accum 2 --update-in-backward",
          "--pp-virtual 2) with --update-in-backward: the fused update steps each unit");
}

}  // namespace
}  // namespace memfit
