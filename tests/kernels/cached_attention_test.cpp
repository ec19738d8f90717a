// Tests of attention over a key/value cache (the decode step's, Note [KV cache]): rows of new
// queries at a position offset, with the cache holding the keys and values of every earlier
// position, against the double-precision reference over the whole window (its rows of those
// positions), for multi-head and grouped-query heads, odd head sizes, a step of one row and of
// several, at the first position and the last; bf16 operands within bf16's rounding; the result
// does not depend on the thread count; bad arguments are typed errors.
#include "memfit/kernels/cpu/cached_attention.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cstring>
#include <vector>

#include "matmul_test_util.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/ref/attention_ref.h"

namespace memfit::kernels {
namespace {

using matmul_test::random_tensor;
using matmul_test::rel_error;
using matmul_test::to_double;

struct Case {
  int64_t T, hs;
  int q, kv;
  int64_t position, rows;  // the step: rows [position, position + rows)
};
const Case kCases[] = {{1, 8, 1, 1, 0, 1},     {17, 24, 2, 2, 0, 5},  {17, 24, 2, 2, 16, 1},
                       {33, 64, 8, 2, 12, 7},  {40, 6, 4, 2, 39, 1},  {21, 160, 2, 1, 3, 18},
                       {64, 128, 4, 4, 31, 33}};

// The step's output from the cache written with the keys and values of rows [0, position + rows)
// of qkv (1, T, width), in `dtype`.
Tensor step(MemoryPool& pool, const Tensor& qkv, const Case& c, DType dtype, DType out_dtype) {
  const AttentionHeads heads{c.q, c.kv};
  const int64_t W = heads.qkv_width(c.hs), kvw = c.kv * c.hs, S = c.rows;
  Tensor q = Tensor::empty(pool, {S, W}, dtype, Category::workspace, "q");
  Tensor kc = Tensor::empty(pool, {c.T, kvw}, dtype, Category::activations, "k");
  Tensor vc = Tensor::empty(pool, {c.T, kvw}, dtype, Category::activations, "v");
  Tensor rows = qkv.reshape({c.T, W});
  Tensor mine = rows.slice(c.position, c.position + S);
  convert(q, mine);
  std::vector<float> k(static_cast<size_t>(c.T * kvw)), v(k.size());
  const float* src = rows.data<float>();
  for (int64_t t = 0; t < c.position + S; ++t) {
    std::memcpy(&k[t * kvw], src + t * W + c.q * c.hs, kvw * sizeof(float));
    std::memcpy(&v[t * kvw], src + t * W + c.q * c.hs + kvw, kvw * sizeof(float));
  }
  Tensor kf = Tensor::empty(pool, {c.T, kvw}, DType::f32, Category::workspace, "kf");
  Tensor vf = Tensor::empty(pool, {c.T, kvw}, DType::f32, Category::workspace, "vf");
  std::copy(k.begin(), k.end(), kf.data<float>());
  std::copy(v.begin(), v.end(), vf.data<float>());
  convert(kc, kf);
  convert(vc, vf);
  Tensor out = Tensor::empty(pool, {S, heads.out_width(c.hs)}, out_dtype, Category::workspace, "o");
  Tensor scores = Tensor::empty(
      pool, {static_cast<int64_t>(cached_attention_scores_bytes(S, heads, c.T) / 4)}, DType::f32,
      Category::workspace, "scores");
  cached_attention_forward(out, q, kc, vc, c.position, heads, scores);
  if (out_dtype == DType::f32) return out;
  Tensor wide = Tensor::empty(pool, out.shape(), DType::f32, Category::workspace, "wide");
  convert(wide, out);
  return wide;
}

// The reference's rows of the step.
std::vector<double> want(const Tensor& qkv, const Case& c) {
  const AttentionHeads heads{c.q, c.kv};
  const int64_t C = heads.out_width(c.hs);
  std::vector<double> out(static_cast<size_t>(c.T * C)), att(static_cast<size_t>(c.q * c.T * c.T));
  ref::attention_forward(out.data(), att.data(), to_double(qkv).data(), 1, c.T, C, heads);
  return {out.begin() + c.position * C, out.begin() + (c.position + c.rows) * C};
}

TEST(CachedAttention, MatchesTheWholeWindowsReferenceAtItsPositions) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << " hs " << c.hs << " heads " << c.q << "/"
                                    << c.kv << " rows " << c.position << "+" << c.rows);
    MemoryPool pool;
    const Tensor qkv = random_tensor(pool, {1, c.T, AttentionHeads{c.q, c.kv}.qkv_width(c.hs)},
                                     static_cast<uint64_t>(c.T * 31 + c.hs));
    const std::vector<double> w = want(qkv, c);
    EXPECT_LT(rel_error(step(pool, qkv, c, DType::f32, DType::f32), w), 1e-5);
    // bf16 operands and output: each rounded once (2^-9 relative), the sums in f32.
    EXPECT_LT(rel_error(step(pool, qkv, c, DType::bf16, DType::bf16), w), 2e-2);
  }
}

TEST(CachedAttention, DoesNotDependOnTheThreadCount) {
  const Case c = {64, 128, 4, 2, 20, 30};
  MemoryPool pool;
  const Tensor qkv = random_tensor(pool, {1, c.T, AttentionHeads{c.q, c.kv}.qkv_width(c.hs)}, 3);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<double> one = to_double(step(pool, qkv, c, DType::f32, DType::f32));
  omp_set_num_threads(4);
  const std::vector<double> four = to_double(step(pool, qkv, c, DType::f32, DType::f32));
  omp_set_num_threads(threads);
  EXPECT_EQ(one, four);
}

TEST(CachedAttention, BadArgumentsAreTypedErrors) {
  MemoryPool pool;
  const AttentionHeads heads{4, 2};
  const int64_t hs = 8, T = 10;
  Tensor q = Tensor::empty(pool, {2, heads.qkv_width(hs)}, DType::f32, Category::workspace, "q");
  Tensor kc = Tensor::empty(pool, {T, 2 * hs}, DType::f32, Category::workspace, "k");
  Tensor vc = Tensor::empty(pool, {T, 2 * hs}, DType::f32, Category::workspace, "v");
  Tensor out = Tensor::empty(pool, {2, 4 * hs}, DType::f32, Category::workspace, "o");
  Tensor scores = Tensor::empty(
      pool, {static_cast<int64_t>(cached_attention_scores_bytes(2, heads, T) / 4)}, DType::f32,
      Category::workspace, "s");
  EXPECT_NO_THROW(cached_attention_forward(out, q, kc, vc, 8, heads, scores));
  EXPECT_THROW(cached_attention_forward(out, q, kc, vc, 9, heads, scores), ShapeError);
  Tensor small = scores.slice(0, 10);
  EXPECT_THROW(cached_attention_forward(out, q, kc, vc, 0, heads, small), Error);
  Tensor i32 = Tensor::empty(pool, {2, 4 * hs}, DType::i32, Category::workspace, "i");
  EXPECT_THROW(cached_attention_forward(i32, q, kc, vc, 0, heads, scores), DTypeError);
  EXPECT_THROW(cached_attention_forward(out, q, kc, vc, 0, {4, 4}, scores), ShapeError);
}

}  // namespace
}  // namespace memfit::kernels
