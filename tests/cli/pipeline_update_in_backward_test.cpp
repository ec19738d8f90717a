// --update-in-backward under --pp, end to end under mpirun (Note [Update in backward], "Under
// --pp"): each stage steps its own units as its backward ends them, and the clipping norm is
// every stage's parts added in stage order once the pass through the stages is over (global
// clipping: a measuring pass through the stages, then the stepping pass). LLaMA (untied) with
// one micro-batch a step: the losses, gradient norms and validation losses are the ordinary
// --pp step's bits and one process's with the flag, under global clipping that binds, per-unit
// clipping and none; dp 2 x pp 2 at ZeRO 2 and 3 is the ordinary step's at the same layout.
// The plan is every world rank's measured peak by category. A tied table is refused.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineUpdateInBackward : public test::PipelineBinaryTest {
 protected:
  PipelineUpdateInBackward() : PipelineBinaryTest(4351) {}
};

// One micro-batch a step (the flag's rule), clipping that binds, a validation loss every two.
constexpr const char* kBase = "--steps 4 --grad-accum 1 --eval-every 2 --eval-batches 2";
const std::string kSteps = std::string(kBase) + " --clip 0.05";
constexpr const char* kFlag = " --update-in-backward";

TEST_F(PipelineUpdateInBackward, IsTheOrdinaryStepAndOneProcesssBitForBit) {
  const std::vector<const char*> keys = {"loss", "grad_norm", "val_loss"};
  for (const char* more : {"", " --precision bf16 --master-weights none"}) {
    const std::string a = kSteps + more;
    // Global clipping: the measuring pass's norm over the stages, then the stepping pass.
    const auto fused = train(2, a + " --pp 2" + kFlag, "fused");
    expect_close(train(2, a + " --pp 2", "ordinary"), fused, keys, 0,
                 fmt::format("--pp 2{} against the ordinary step", more));
    expect_close(train(0, a + kFlag, "one"), fused, keys, 0,
                 fmt::format("--pp 2{} against one process", more));
  }
  // Four stages of one block (the middle ones hold neither edge), GPipe, no clipping.
  const std::string none = std::string(kBase) + " --clip 0";
  expect_close(train(0, none + kFlag, "one"),
               train(4, none + " --pp 4 --pp-schedule gpipe" + kFlag, "pp4"), keys, 0,
               "--pp 4 --clip 0");
  // Per-unit clipping: each unit lies in one stage, so each is clipped as one process does.
  const std::string unit = std::string(kBase) + " --clip 0.01 --clip-mode unit" + kFlag;
  expect_close(train(0, unit, "one"), train(2, unit + " --pp-layers 1,3 --pp 2", "pp2"), keys,
               0, "--pp 2 --clip-mode unit");
}

// Over data ranks (ZeRO 2-3, the flag's rule): each stage's data ranks reduce-scatter its
// units and step their parts; the norm adds each stage's ranks' sums, in stage order, as the
// ordinary --pp step's check does.
TEST_F(PipelineUpdateInBackward, OverDataRanksIsTheOrdinaryStep) {
  for (const char* zero : {" --zero 2", " --zero 3"}) {
    const std::string a = kSteps + zero + " --pp 2";
    expect_close(train(4, a, "ordinary"), train(4, a + kFlag, "fused"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("dp 2 x pp 2{}", zero));
  }
}

// Stages of tensor groups (--pp 2 --tp 2, a key/value head replicated on both tensor ranks,
// --sp): each unit's partial sums over the tensor group before its step, each stage's norm
// the tensor group's, the stages' added in stage order. The ordinary step sums the stages'
// split squares before the tensor group's sum, so the norm may differ by rounding (measured:
// the same bits here); one process with the flag within --tp's fp32 bound (the losses the same
// bits, the norms a few ulps).
TEST_F(PipelineUpdateInBackward, StagesOfTensorGroupsMatchWithinRounding) {
  const std::vector<const char*> keys = {"loss", "grad_norm", "val_loss"};
  for (const char* more : {" --clip 0.05", " --clip 0"}) {
    const std::string a = kBase + std::string(more) + " --n-kv-head 1";
    const auto fused = train(4, a + " --pp 2 --tp 2 --sp" + kFlag, "fused");
    expect_close(train(4, a + " --pp 2 --tp 2 --sp", "ordinary"), fused, keys, 1e-6,
                 fmt::format("--pp 2 --tp 2{} against the ordinary step", more));
    expect_close(train(0, a + kFlag, "one"), fused, keys, 1e-5,
                 fmt::format("--pp 2 --tp 2{} against one process", more));
  }
}

// No gradient slab: a stage's grads are its one unit slot (its largest unit), and global
// clipping's second pass allocates nothing more; every world rank's peak is planned.
TEST_F(PipelineUpdateInBackward, ThePlanIsEveryRanksMeasuredPeak) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--pp 2 --clip 0.05"},
           {4, "--pp 4 --clip 0 --precision bf16 --pp-schedule gpipe"},
           {4, "--pp 2 --zero 3 --clip 0.05"}}) {
    const json plan =
        expect_plan_is_measured(ranks, "--steps 2 --grad-accum 1" + std::string(kFlag) + " " + more);
    // Rank 0's (stage 0's) collectives a step: both passes, each with its forward alone.
    for (const json& j : lines(dir / "plan.jsonl"))
      if (j.contains("loss") && plan["stages"][0].contains("comm_per_step")) {
        for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
          EXPECT_EQ(j["comm_bytes"][c], plan["stages"][0]["comm_per_step"][c]) << c << ", " << more;
      }
    // The stages' gradients are their unit slots (a stage's largest unit): together less
    // than the model's parameters' f32 bytes. (At ZeRO 3 the unit buffers are comm.)
    if (more.find("--zero") != std::string::npos) continue;
    size_t grads = 0;
    for (const json& s : plan["stages"]) grads += s["by_category"].value("grads", size_t{0});
    EXPECT_GT(grads, 0u) << more;
    EXPECT_LT(grads, 4 * plan["whole_model_params"].get<size_t>()) << more;
  }
}

TEST_F(PipelineUpdateInBackward, RefusesATiedTableNamingWhy) {
  const int code = run_memfit("plan " + args("--model gpt2-tiny --steps 2 --world-size 2 --pp 2" +
                                             std::string(kFlag)));
  EXPECT_NE(code, 0);
  const std::string err = test::slurp(dir / "err.txt");
  for (const char* s : {"--update-in-backward with --pp 2 and tied embeddings", "first stage"})
    EXPECT_NE(err.find(s), std::string::npos) << err;
}

}  // namespace
}  // namespace memfit
