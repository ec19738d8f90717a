// Sequence parallelism's moves (model/sequence_parallel.h, Note [Sequence parallel]) over the
// whole world as one tensor group (alone: a group of one; in CI under `mpirun -n 2` and `-n 4`):
// the rows a rank holds, the in-place gather, and the reduce-scatter, whose sums must be the
// all-reduce's bit for bit (the all-reduce is a reduce-scatter then a gather). No ASSERT before
// a collective (a rank that returned early would leave the others waiting).
#include <gtest/gtest.h>

#include <vector>

#include "memfit/dist/communicator.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/sequence_parallel.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

// Rank q's value at element i: distinct on every rank, not exactly representable sums.
float value(int q, int64_t i) { return 0.1f * static_cast<float>(q + 1) + 1e-3f * i; }

TEST(SequenceParallel, RowsGatherAndReduceScatter) {
  CommunicatorTensorGroup group(world());
  const int T = group.size(), me = group.rank();
  const int64_t n = 3, C = 5, N = n * T;
  MemoryPool pool;
  Tensor full = Tensor::empty(pool, {1, N, C}, DType::f32, Category::workspace, "full");
  Tensor mine = sequence_mine(group, full);
  EXPECT_EQ(mine.numel(), n * C);
  EXPECT_EQ(mine.data<float>(), full.data<float>() + me * n * C);

  // The gather: each rank writes its rows in place; every rank then holds all of them.
  for (int64_t i = 0; i < n * C; ++i) mine.data<float>()[i] = value(me, me * n * C + i);
  sequence_gather(group, full);
  for (int q = 0; q < T; ++q)
    for (int64_t i = q * n * C; i < (q + 1) * n * C; ++i)
      EXPECT_EQ(full.data<float>()[i], value(q, i)) << "element " << i;

  // The reduce-scatter: the rank's rows hold the sum in rank order, the all-reduce's bits.
  std::vector<float> reduced(static_cast<size_t>(N * C));
  for (int64_t i = 0; i < N * C; ++i)
    full.data<float>()[i] = reduced[static_cast<size_t>(i)] = value(me, i);
  group.all_reduce_sum(reduced);
  sequence_scatter_sum(group, full);
  for (int64_t i = me * n * C; i < (me + 1) * n * C; ++i) {
    float s = value(0, i);
    for (int q = 1; q < T; ++q) s += value(q, i);
    EXPECT_EQ(full.data<float>()[i], s) << "element " << i;
    EXPECT_EQ(full.data<float>()[i], reduced[static_cast<size_t>(i)]) << "element " << i;
  }

  // gather_from: a separate (n, C) buffer's rows into their place, then gathered.
  Tensor rows = Tensor::empty(pool, {n, C}, DType::f32, Category::workspace, "rows");
  for (int64_t i = 0; i < n * C; ++i) rows.data<float>()[i] = value(me, 7 * i);
  sequence_gather_from(group, rows, full);
  for (int q = 0; q < T; ++q)
    for (int64_t i = 0; i < n * C; ++i)
      EXPECT_EQ(full.data<float>()[q * n * C + i], value(q, 7 * i));
}

TEST(SequenceParallel, RowsAndRefusals) {
  ModelConfig config;
  config.finalize();
  ActivationOptions options;
  options.sequence_parallel = true;
  EXPECT_FALSE(sequence_parallel(config, options));  // one tensor rank: nothing to split
  EXPECT_EQ(sequence_rows(config, options, 64), 64);
  config.set_tensor_parallel(4);
  EXPECT_TRUE(sequence_parallel(config, options));
  EXPECT_EQ(sequence_rows(config, options, 64), 16);
  check_sequence_parallel(config, options, 32);
  try {
    check_sequence_parallel(config, options, 30);
    ADD_FAILURE() << "--sp accepted 30 tokens over --tp 4";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-len 30 must divide by 4"), std::string::npos)
        << e.what();
  }
  options.precision = Precision::bf16;  // built in bf16 too (tests/cli/tensor_parallel_test.cpp)
  check_sequence_parallel(config, options, 32);
  options.precision = Precision::fp16;  // and fp16 (SequenceParallelComposesWithZeroAndFp16)
  check_sequence_parallel(config, options, 32);
  options.precision = Precision::fp8;  // and fp8 (HalfPrecisionsOverTwoRanksMatchOneProcess)
  check_sequence_parallel(config, options, 32);
  EXPECT_TRUE(sequence_partial(ParamRole::norm_weight));
  EXPECT_TRUE(sequence_partial(ParamRole::norm_bias));
  EXPECT_FALSE(sequence_partial(ParamRole::linear_bias));
  EXPECT_FALSE(sequence_partial(ParamRole::position_embedding));
}

}  // namespace
}  // namespace memfit::dist
