// The tensor group's collectives per step under --tp (plan/tensor_comm.h): their count and bytes
// from the step plan's phases (recomputation and accumulation included), their price at this
// host's rates one all-reduce at a time, and that the step-time estimate carries that price as
// its own term (Note [Tensor parallel]); under --pp each stage's own. The measured counts equal
// these under mpirun: tests/cli/tensor_parallel_test.cpp, pipeline_tensor_parallel_test.cpp.
#include "memfit/plan/tensor_comm.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/plan/memory_plan.h"
#include "plan_test_util.h"

namespace memfit {
namespace {

RunSpec tp_spec(int tp, const char* ckpt, int grad_accum = 1) {
  TrainConfig c;
  c.model = "gpt2-tiny";  // 2 blocks, width 96, 4 heads
  c.data_dir = test::empty_data_dir("tensor_comm");
  c.batch = 2;
  c.seq_len = 32;
  c.grad_accum = grad_accum;
  c.ranks = tp;
  c.tp = tp;
  c.ckpt = ckpt;
  c.threads = 1;
  return resolve_run(c);
}

TEST(TensorComm, AllReducesAreCountedPerBlockPhaseAndMicroBatch) {
  const int64_t each = 2 * 32 * 96 * 4;  // B x T x C f32
  for (int tp : {2, 4}) {
    for (const auto& [ckpt, accum, count] :
         std::vector<std::tuple<const char*, int, int64_t>>{
             // 2 blocks: 2 in each forward and each backward, the embedding's and d(norm)
             {"none", 1, 10},
             {"full", 1, 14},  // and 2 in each recomputed forward
             {"none", 3, 30},  // every micro-batch
         }) {
      const RunSpec spec = tp_spec(tp, ckpt, accum);
      const TensorCommVolume v = tensor_comm_per_step(spec, plan_training(spec).step);
      EXPECT_EQ(v.all_reduce_count, count) << tp << ", " << ckpt << ", " << accum;
      EXPECT_EQ(v.all_reduce_each(), each);
      EXPECT_EQ(v.all_reduce_bytes, count * each);
      // A float and two doubles a row of every micro-batch, and the update's two doubles.
      EXPECT_EQ(v.gathered_bytes, accum * 64 * 20 + 16);
    }
  }
  const RunSpec one = tp_spec(1, "none");
  const TensorCommVolume none = tensor_comm_per_step(one, plan_training(one).step);
  EXPECT_EQ(none.all_reduce_count, 0);
  EXPECT_EQ(none.all_reduce_each(), 0);
}

// --pp with --tp (Note [Pipeline parallel], "Stages of tensor groups"): each stage counts its
// own collectives. llama-tiny at 4 blocks over 2 stages, 3 micro-batches: stage 0 has the
// embedding and runs each forward twice (to send, then before its backward), stage 1 the LM
// head and the loss's statistics; the update's two doubles on both.
TEST(TensorComm, EachPipelineStageCountsItsOwnCollectives) {
  const int64_t N = 2 * 32, each = N * 96 * 4;  // B x T x C f32
  for (bool sp : {false, true}) {
    TrainConfig c;
    c.model = "llama-tiny";
    c.n_layer = 4;
    c.data_dir = test::empty_data_dir("tensor_comm");
    c.batch = 2;
    c.seq_len = 32;
    c.grad_accum = 3;
    c.ranks = 4;
    c.tp = 2;
    c.pp = 2;
    c.sp = sp;
    c.threads = 1;
    const RunSpec spec = resolve_run(c);
    const RunSpec first = spec.stage(0), last = spec.stage(1);
    const TensorCommVolume a = tensor_comm_per_step(first, plan_training(first).step);
    const TensorCommVolume b = tensor_comm_per_step(last, plan_training(last).step);
    // Stage 0: 2 embeddings, 2 x 2 blocks x 2 forward, 2 blocks x 2 backward; stage 1: d(norm),
    // 2 blocks x 2 forward and x 2 backward.
    EXPECT_EQ(sp ? a.reduce_scatter_count : a.all_reduce_count, 3 * 14) << sp;
    EXPECT_EQ(sp ? b.reduce_scatter_count : b.all_reduce_count, 3 * 9) << sp;
    EXPECT_EQ(sp ? a.reduce_scatter_bytes : a.all_reduce_bytes, 3 * 14 * each) << sp;
    const int64_t stats = 3 * N * 20;  // a float and two doubles a row, the last stage alone
    if (!sp) {
      EXPECT_EQ(a.gathered_bytes, 16);
      EXPECT_EQ(b.gathered_bytes, stats + 16);
      continue;
    }
    // --sp: a rank's rows (N / 2 x C f32) in 2 gathers a forward block (twice on stage 0) and 4
    // a backward one, the final norm's output on the last stage and d(encoded) on the first.
    const int64_t rows = each / 2;
    EXPECT_EQ(a.gathered_bytes, 3 * (16 * rows + rows) + 16);
    EXPECT_EQ(b.gathered_bytes, 3 * 13 * rows + stats + 16);
    // The norms' gradients once a step: each stage's own (2 a block; the final norm on 1).
    EXPECT_EQ(a.all_reduce_count, 4);
    EXPECT_EQ(b.all_reduce_count, 5);
  }
}

// Over T ranks an all-reduce of n bytes sends 2n(T-1)/T and receives as much, each byte copied
// once, and sums n(1 + 1/T); a gather of g bytes a rank sends and receives g(T-1).
TEST(TensorComm, PricedOneAllReduceAtATimeAtTheCopyAndStreamRates) {
  Calibration r;
  r.copy_bytes_per_s = 1e10;
  r.stream_bytes_per_s = 2e10;
  TensorCommVolume v;
  v.all_reduce_count = 10;
  v.all_reduce_bytes = 10 * 1000000;
  v.gathered_bytes = 1000;
  EXPECT_EQ(tensor_comm_seconds(v, 1, r), 0.0);
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(v, 2, r), 10 * (2e6 / 1e10 + 1.5e6 / 2e10) + 2e3 / 1e10);
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(v, 4, r), 10 * (3e6 / 1e10 + 1.25e6 / 2e10) + 6e3 / 1e10);
  // By count and size: twice as many all-reduces of the same size cost twice as much; the same
  // bytes in half as many (twice as large) cost the same (no latency term).
  TensorCommVolume twice = v, larger = v;
  twice.all_reduce_count *= 2;
  twice.all_reduce_bytes *= 2;
  twice.gathered_bytes = larger.gathered_bytes = 0;
  larger.all_reduce_count /= 2;
  TensorCommVolume base = v;
  base.gathered_bytes = 0;
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(twice, 2, r), 2 * tensor_comm_seconds(base, 2, r));
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(larger, 2, r), tensor_comm_seconds(base, 2, r));
}

// The plan's step time carries the price as its own term (not in the data group's `comm`), and
// its total includes it: the step estimate a plan prints (est_step_seconds) is the total.
TEST(TensorComm, ThePlansStepTimeHasTheTensorTerm) {
  const RunSpec one = tp_spec(1, "none"), two = tp_spec(2, "none");
  const PlanReport a = plan_training(one), b = plan_training(two);
  EXPECT_EQ(a.step_time.tensor_comm, 0.0);
  EXPECT_EQ(b.step_time.comm, 0.0);  // one data rank
  // (Its value is tensor_comm_seconds at the plan's rates, tested above; a busy machine may
  // calibrate again between two plans, so it is not compared with another call's here.)
  EXPECT_GT(b.step_time.tensor_comm, 0.0);
  EXPECT_DOUBLE_EQ(b.est_step_seconds, b.step_time.total());
}

}  // namespace
}  // namespace memfit
