// The vocabulary-parallel cross-entropy and the parallel linears in a tensor group of one
// process: the plain kernels' bits (the many-rank checks run under mpirun in
// tests/dist/tensor_parallel_test.cpp); and how a vocabulary is split into padded slices.
#include "memfit/model/vocab_parallel_crossentropy.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/parallel_linear.h"

namespace memfit {
namespace {

Tensor random_tensor(MemoryPool& pool, Shape shape, uint32_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(pool, shape, DType::f32, Category::activations, "test");
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

std::vector<float> floats(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(VocabParallelCrossEntropy, OneRankIsThePlainKernelBitForBit) {
  MemoryPool pool;
  const int64_t R = 9, V = 50257, Vp = 50304;  // GPT-2's vocabulary and its padding
  auto group = make_single_tensor_group();
  Tensor targets = Tensor::empty(pool, {R}, DType::i32, Category::activations, "t");
  Tensor mask = Tensor::empty(pool, {R}, DType::u8, Category::activations, "m");
  for (int64_t r = 0; r < R; ++r) {
    targets.data<int32_t>()[r] = static_cast<int32_t>((r * 7919) % V);
    mask.data<uint8_t>()[r] = r != 4;
  }
  for (DType round_to : {DType::f32, DType::bf16, DType::f16}) {
    for (const Tensor* m : {static_cast<const Tensor*>(nullptr), static_cast<const Tensor*>(&mask)}) {
      Tensor a = random_tensor(pool, {R, Vp}, 5, 80, 100), b = random_tensor(pool, {R, Vp}, 5, 80, 100);
      Tensor la = Tensor::empty(pool, {R}, DType::f32, Category::activations, "l");
      Tensor lb = Tensor::empty(pool, {R}, DType::f32, Category::activations, "l");
      kernels::crossentropy_forward_backward(la, a, targets, V, 0.5f, round_to, m);
      vocab_parallel_crossentropy_forward_backward(*group, lb, b, targets, 0, V, 0.5f, round_to, m);
      EXPECT_EQ(floats(la), floats(lb)) << dtype_name(round_to);
      EXPECT_EQ(floats(a), floats(b)) << dtype_name(round_to);
      Tensor c = random_tensor(pool, {R, Vp}, 5, 80, 100);
      Tensor lc = Tensor::empty(pool, {R}, DType::f32, Category::activations, "l");
      Tensor ld = Tensor::empty(pool, {R}, DType::f32, Category::activations, "l");
      kernels::crossentropy_forward(lc, c, targets, V, m);
      vocab_parallel_crossentropy_forward(*group, ld, c, targets, 0, V, m);
      EXPECT_EQ(floats(lc), floats(ld));
      EXPECT_EQ(floats(lc), floats(la));
    }
  }
}

TEST(VocabParallelCrossEntropy, ShardsArePaddedSlicesThatCoverTheVocabulary) {
  // 50257 over 4 ranks aligned to 64: padded to 50432, 12608 columns a rank.
  const VocabShard last = vocab_shard(50257, 4, 3, 64);
  EXPECT_EQ(last.width, 12608);
  EXPECT_EQ(last.begin, 3 * 12608);
  EXPECT_EQ(last.real, 50257 - 3 * 12608);
  EXPECT_EQ(vocab_shard(50257, 4, 0, 64).real, 12608);
  // 5 over 4 ranks of 2: the last rank holds only padding.
  EXPECT_EQ(vocab_shard(5, 4, 2, 1).real, 1);
  EXPECT_EQ(vocab_shard(5, 4, 3, 1).real, 0);
  // Every vocabulary entry in exactly one rank's real columns.
  for (int ranks : {1, 2, 3, 4, 8}) {
    int64_t covered = 0;
    for (int r = 0; r < ranks; ++r) {
      const VocabShard s = vocab_shard(1003, ranks, r, 8);
      EXPECT_EQ(s.begin, covered < 1003 ? covered : s.begin);
      EXPECT_EQ(s.width % 8, 0);
      covered += s.real;
    }
    EXPECT_EQ(covered, 1003) << ranks;
  }
  EXPECT_THROW(vocab_shard(0, 2, 0), ConfigError);
  EXPECT_THROW(vocab_shard(10, 2, 2), ConfigError);
  EXPECT_THROW(vocab_shard(10, 2, 0, 0), ConfigError);
}

TEST(ParallelLinear, OneRankIsThePlainLinearBitForBit) {
  MemoryPool pool;
  auto group = make_single_tensor_group();
  const int64_t R = 5, IC = 24, OC = 40;
  Tensor x = random_tensor(pool, {R, IC}, 1, -1, 1), w = random_tensor(pool, {OC, IC}, 2, -1, 1);
  Tensor b = random_tensor(pool, {OC}, 3, -1, 1), dy = random_tensor(pool, {R, OC}, 4, -1, 1);
  auto empty = [&](Shape s) { return Tensor::empty(pool, s, DType::f32, Category::activations, "e"); };
  Tensor y = empty({R, OC}), yc = empty({R, OC}), dx = empty({R, IC}), dxc = empty({R, IC}),
         dxr = empty({R, IC});
  Tensor dw = empty({OC, IC}), dwc = empty({OC, IC}), db = empty({OC}), dbc = empty({OC});
  kernels::matmul_forward(y, x, w, b);
  kernels::matmul_backward(dx, dw, db, dy, x, w);
  column_parallel_linear_forward(yc, x, w, b);
  column_parallel_linear_backward(*group, dxc, dwc, dbc, dy, x, w);
  EXPECT_EQ(floats(y), floats(yc));
  EXPECT_EQ(floats(dx), floats(dxc));
  EXPECT_EQ(floats(dw), floats(dwc));
  EXPECT_EQ(floats(db), floats(dbc));
  // Row-parallel adds the bias after the (here trivial) sum: the same bits without a bias.
  Tensor none, yr = empty({R, OC}), y0 = empty({R, OC});
  kernels::matmul_forward(y0, x, w, none);
  row_parallel_linear_forward(*group, yr, x, w, none);
  EXPECT_EQ(floats(y0), floats(yr));
  row_parallel_linear_backward(dxr, none, none, dy, x, w);
  EXPECT_EQ(floats(dx), floats(dxr));
  // The sum over the group is f32: a bf16 output is refused, naming it.
  Tensor ybf = Tensor::empty(pool, {R, OC}, DType::bf16, Category::activations, "bf");
  EXPECT_THROW(row_parallel_linear_forward(*group, ybf, x, w, none), DTypeError);
}

}  // namespace
}  // namespace memfit
