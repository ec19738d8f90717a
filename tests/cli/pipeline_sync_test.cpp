// --sync-every-micro-batch under --pp, end to end under mpirun (Note [ZeRO], "Bit-identity of
// stages 0-2"; Note [Pipeline parallel], "ZeRO on the data group"): each stage's data ranks at
// ZeRO 0-1 reduce every micro-batch unit by unit into a whole accumulator, as stages 2-3 reduce
// into their shards, so `dp 2 x pp 2` at ZeRO 0 and 1 with the flag gives ZeRO 2's losses,
// gradient norms and validation losses bit for bit under accumulation (a test mode); the plan
// is every world rank's measured peak by category and stage 0's collectives the log's.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineSync : public test::PipelineBinaryTest {
 protected:
  PipelineSync() : PipelineBinaryTest(4353) {}
};

constexpr const char* kSteps =
    "--steps 3 --grad-accum 2 --clip 0.05 --eval-every 3 --eval-batches 2 --pp 2";

TEST_F(PipelineSync, StagesZeroAndOneAreStageTwosBits) {
  const std::vector<const char*> keys = {"loss", "grad_norm", "val_loss"};
  const auto ref = train(4, std::string(kSteps) + " --zero 2", "zero2");
  for (const char* zero : {" --zero 0", " --zero 1"})
    expect_close(ref, train(4, kSteps + std::string(zero) + " --sync-every-micro-batch", "sync"),
                 keys, 0, fmt::format("dp 2 x pp 2{} --sync-every-micro-batch", zero), 6);
  // A tied GPT-2: the table's two parts summed between the first and last stages from the
  // whole accumulators (within rounding of ZeRO 2's shard pieces, as PipelineZero's bound).
  const std::string gpt2 = std::string(kSteps) + " --model gpt2-tiny";
  expect_close(train(4, gpt2 + " --zero 2", "zero2"),
               train(4, gpt2 + " --zero 0 --sync-every-micro-batch", "sync"), keys, 1e-6,
               "gpt2 dp 2 x pp 2 --zero 0 --sync-every-micro-batch", 6);
}

TEST_F(PipelineSync, ThePlanIsEveryRanksMeasuredPeak) {
  for (const char* more : {"--zero 0", "--zero 1 --model gpt2-tiny"}) {
    const std::string a = fmt::format("--steps 2 --grad-accum 2 --pp 2 --sync-every-micro-batch {}", more);
    const json plan = expect_plan_is_measured(4, a);
    int steps = 0;
    for (const json& j : lines(dir / "plan.jsonl")) {
      if (!j.contains("loss")) continue;
      ++steps;
      for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
        EXPECT_EQ(j["comm_bytes"][c], plan["stages"][0]["comm_per_step"][c]) << c << ", " << a;
    }
    EXPECT_EQ(steps, 2) << a;
  }
}

}  // namespace
}  // namespace memfit
