// Attention in mixed precision: with qkv, att, out, dout and dqkv in any of f32, bf16 and f16,
// the results are exactly the f32 kernel's on the widened inputs, rounded once to each output's
// type (the same f32 arithmetic runs on copies); against the double reference on unrounded
// inputs within bf16's error; the workspace contract; and the dtype errors. Grouped-query heads
// the same way.
#include <gtest/gtest.h>
#include <omp.h>

#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/ref/attention_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

struct AttnShape {
  int64_t B, T, C;
  int NH;
};
// hs = 8, 24, 64 and 160 (two depth chunks); T = 1 and odd T.
const AttnShape kShapes[] = {{1, 1, 8, 1}, {2, 17, 48, 2}, {2, 33, 128, 2}, {1, 21, 320, 2}};

struct Types {
  DType qkv, att, out;
};
const Types kTypes[] = {{DType::bf16, DType::bf16, DType::bf16},
                        {DType::bf16, DType::f32, DType::f32},
                        {DType::f32, DType::bf16, DType::bf16},
                        {DType::f16, DType::f16, DType::f16},
                        {DType::f16, DType::bf16, DType::f32}};

Tensor workspace(MemoryPool& pool, size_t bytes) {
  return make_tensor(pool, {std::max<int64_t>(1, static_cast<int64_t>(bytes / sizeof(float)))});
}

TEST(AttentionMixed, ForwardAndBackwardAreTheF32KernelRounded) {
  MemoryPool pool;
  for (const auto& [B, T, C, NH] : kShapes) {
    for (const auto& [qt, pt, ot] : kTypes) {
      SCOPED_TRACE(fmt::format("B={} T={} C={} NH={} qkv {} att {} out {}", B, T, C, NH,
                               dtype_name(qt), dtype_name(pt), dtype_name(ot)));
      std::vector<double> x_raw = random_values(B * T * 3 * C, 1, -2, 2);
      Tensor qkv = make_tensor(pool, {B, T, 3 * C}, qt);
      copy_in_any(qkv, x_raw);
      Tensor qkv32 = as(pool, qkv, DType::f32);
      // Forward: mixed against f32 on the same values.
      Tensor out = random_any(pool, {B, T, C}, ot, 2), att = random_any(pool, {B, NH, T, T}, pt, 3);
      Tensor ws = workspace(pool, attention_forward_workspace_bytes(B, T, C, NH, qt, pt, ot));
      attention_forward(out, att, qkv, ws, NH);
      Tensor out32 = make_tensor(pool, {B, T, C}), att32 = make_tensor(pool, {B, NH, T, T});
      attention_forward(out32, att32, qkv32, NH);
      EXPECT_TRUE(same_bits(out, as(pool, out32, ot))) << "out";
      EXPECT_TRUE(same_bits(att, as(pool, att32, pt))) << "att";
      // ... and against double on the unrounded qkv: the cost of the storage types.
      std::vector<double> want_out(out.numel()), want_att(att.numel());
      ref::attention_forward(want_out.data(), want_att.data(), x_raw.data(), B, T, C, NH);
      EXPECT_LT(rel_error(to_doubles_any(out), want_out), 2e-2) << "out";
      EXPECT_LT(rel_error(to_doubles_any(att), want_att), 2e-2) << "att";

      // Backward with dout and dqkv in the output's type.
      std::vector<double> g_raw = random_values(B * T * C, 4);
      Tensor dout = make_tensor(pool, {B, T, C}, ot);
      copy_in_any(dout, g_raw);
      Tensor dqkv = random_any(pool, {B, T, 3 * C}, ot, 5);
      Tensor bws = workspace(pool, attention_backward_workspace_bytes(B, T, C, NH, qt, pt, ot, ot));
      attention_backward(dqkv, dout, qkv, att, bws, NH);
      Tensor dqkv32 = make_tensor(pool, {B, T, 3 * C});
      Tensor ws32 = workspace(pool, attention_backward_workspace_bytes(B, T, C, NH));
      Tensor att_w = as(pool, att, DType::f32);  // the saved probabilities, widened
      attention_backward(dqkv32, as(pool, dout, DType::f32), qkv32, att_w, ws32, NH);
      EXPECT_TRUE(same_bits(dqkv, as(pool, dqkv32, ot))) << "dqkv";
      std::vector<double> want_d(dqkv.numel());
      ref::attention_backward(want_d.data(), g_raw.data(), x_raw.data(), want_att.data(), B, T, C,
                              NH);
      EXPECT_LT(rel_error(to_doubles_any(dqkv), want_d), 3e-2) << "dqkv";
    }
  }
}

// f32 dout into bf16 dqkv (the model's attention projection backward writes f32), and the
// reverse, against the f32 kernel.
TEST(AttentionMixed, BackwardMixesDoutAndDqkvTypes) {
  MemoryPool pool;
  const int64_t B = 2, T = 19, C = 64;
  const int NH = 4;
  for (auto [gt, dt] : {std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::f32}}) {
    Tensor qkv = random_any(pool, {B, T, 3 * C}, DType::bf16, 1);
    Tensor out = make_tensor(pool, {B, T, C}, DType::bf16);
    Tensor att = make_tensor(pool, {B, NH, T, T}, DType::bf16);
    Tensor fws = workspace(pool, attention_forward_workspace_bytes(B, T, C, NH, DType::bf16,
                                                                   DType::bf16, DType::bf16));
    attention_forward(out, att, qkv, fws, NH);
    Tensor dout = random_any(pool, {B, T, C}, gt, 2);
    Tensor dqkv = make_tensor(pool, {B, T, 3 * C}, dt);
    Tensor ws = workspace(
        pool, attention_backward_workspace_bytes(B, T, C, NH, DType::bf16, DType::bf16, gt, dt));
    attention_backward(dqkv, dout, qkv, att, ws, NH);
    Tensor d32 = make_tensor(pool, {B, T, 3 * C});
    Tensor ws32 = workspace(pool, attention_backward_workspace_bytes(B, T, C, NH));
    attention_backward(d32, as(pool, dout, DType::f32), as(pool, qkv, DType::f32),
                       as(pool, att, DType::f32), ws32, NH);
    EXPECT_TRUE(same_bits(dqkv, as(pool, d32, dt))) << dtype_name(gt) << " " << dtype_name(dt);
  }
}

TEST(AttentionMixed, WorkspaceContract) {
  MemoryPool pool;
  const int64_t B = 2, T = 13, C = 32;
  const int NH = 4, hs = 8;
  const DType bf = DType::bf16;
  // All f32 through the overload needs no workspace.
  Tensor qkv32 = random_tensor(pool, {B, T, 3 * C}, 1), none;
  Tensor out32 = make_tensor(pool, {B, T, C}), att32 = make_tensor(pool, {B, NH, T, T});
  EXPECT_EQ(attention_forward_workspace_bytes(B, T, C, NH, DType::f32, DType::f32, DType::f32), 0u);
  EXPECT_NO_THROW(attention_forward(out32, att32, qkv32, none, NH));
  // One thread's slice suffices and gives the same bits; less is an error that says how much.
  Tensor qkv = as(pool, qkv32, bf);
  Tensor out = make_tensor(pool, {B, T, C}, bf), att = make_tensor(pool, {B, NH, T, T}, bf);
  Tensor out1 = make_tensor(pool, {B, T, C}, bf), att1 = make_tensor(pool, {B, NH, T, T}, bf);
  const int64_t slice = 3 * T * hs + T * T + T * hs;
  Tensor full = workspace(pool, attention_forward_workspace_bytes(B, T, C, NH, bf, bf, bf));
  Tensor one = make_tensor(pool, {slice}), small = make_tensor(pool, {slice - 1});
  attention_forward(out, att, qkv, full, NH);
  attention_forward(out1, att1, qkv, one, NH);
  EXPECT_TRUE(same_bits(out, out1));
  EXPECT_TRUE(same_bits(att, att1));
  EXPECT_TRUE(throws_with<ShapeError>([&] { attention_forward(out1, att1, qkv, small, NH); },
                                      {"[attention]", "workspace", "attention_*_workspace_bytes"}));
  // The f32-only forward names the overload's reason: it takes no half types.
  EXPECT_TRUE(throws_with<DTypeError>([&] { attention_forward(out, att, qkv, NH); },
                                      {"[attention]", "qkv must be f32, got bf16", "overload"}));
  // Backward: one slice = (T, T) dS + (T, T) att + q, k, v + dout + dq, dk, dv.
  Tensor dout = random_any(pool, {B, T, C}, bf, 2), dqkv = make_tensor(pool, {B, T, 3 * C}, bf);
  const int64_t bslice = 2 * T * T + 7 * T * hs;
  EXPECT_EQ(attention_backward_workspace_bytes(B, T, C, NH, bf, bf, bf, bf),
            static_cast<size_t>(std::min<int64_t>(omp_get_max_threads(), B * NH) * bslice * 4));
  Tensor bsmall = make_tensor(pool, {bslice - 1}), bone = make_tensor(pool, {bslice});
  EXPECT_THROW(attention_backward(dqkv, dout, qkv, att, bsmall, NH), ShapeError);
  EXPECT_NO_THROW(attention_backward(dqkv, dout, qkv, att, bone, NH));
}

// Grouped-query heads: mixed precision is still the f32 kernel on the widened values, rounded
// once, with dk, dv summed over a group in f32 before they round.
TEST(AttentionMixed, GqaIsTheF32KernelRounded) {
  MemoryPool pool;
  struct GqaShape {
    int64_t B, T, hs;
    int q, kv;
  };
  for (const auto& [B, T, hs, q, kv] : {GqaShape{2, 17, 8, 6, 2}, GqaShape{1, 21, 160, 4, 1}}) {
    const AttentionHeads heads{q, kv};
    const int64_t C = heads.out_width(hs), W = heads.qkv_width(hs);
    for (const auto& [qt, pt, ot] : kTypes) {
      SCOPED_TRACE(fmt::format("B={} T={} hs={} q={} kv={} qkv {} att {} out {}", B, T, hs, q, kv,
                               dtype_name(qt), dtype_name(pt), dtype_name(ot)));
      std::vector<double> x_raw = random_values(B * T * W, 1, -2, 2);
      Tensor qkv = make_tensor(pool, {B, T, W}, qt);
      copy_in_any(qkv, x_raw);
      Tensor qkv32 = as(pool, qkv, DType::f32);
      Tensor out = random_any(pool, {B, T, C}, ot, 2), att = random_any(pool, {B, q, T, T}, pt, 3);
      Tensor ws = workspace(pool, attention_forward_workspace_bytes(B, T, C, heads, qt, pt, ot));
      attention_forward(out, att, qkv, ws, heads);
      Tensor out32 = make_tensor(pool, {B, T, C}), att32 = make_tensor(pool, {B, q, T, T});
      attention_forward(out32, att32, qkv32, heads);
      EXPECT_TRUE(same_bits(out, as(pool, out32, ot))) << "out";
      EXPECT_TRUE(same_bits(att, as(pool, att32, pt))) << "att";

      Tensor dout = random_any(pool, {B, T, C}, ot, 4);
      Tensor dqkv = random_any(pool, {B, T, W}, ot, 5);
      Tensor bws =
          workspace(pool, attention_backward_workspace_bytes(B, T, C, heads, qt, pt, ot, ot));
      attention_backward(dqkv, dout, qkv, att, bws, heads);
      Tensor dqkv32 = make_tensor(pool, {B, T, W});
      Tensor ws32 = workspace(pool, attention_backward_workspace_bytes(B, T, C, heads));
      attention_backward(dqkv32, as(pool, dout, DType::f32), qkv32, as(pool, att, DType::f32),
                         ws32, heads);
      EXPECT_TRUE(same_bits(dqkv, as(pool, dqkv32, ot))) << "dqkv";
      std::vector<double> want_out(out.numel()), want_att(att.numel()), want_d(dqkv.numel());
      ref::attention_forward(want_out.data(), want_att.data(), x_raw.data(), B, T, C, heads);
      ref::attention_backward(want_d.data(), to_doubles_any(dout).data(), x_raw.data(),
                              want_att.data(), B, T, C, heads);
      EXPECT_LT(rel_error(to_doubles_any(out), want_out), 2e-2) << "out";
      EXPECT_LT(rel_error(to_doubles_any(dqkv), want_d), 3e-2) << "dqkv";
    }
  }
}

// Backward runs a task per (b, key/value head): its workspace has that many slices at most.
TEST(AttentionMixed, GqaWorkspaceContract) {
  MemoryPool pool;
  const int64_t B = 2, T = 13, hs = 8;
  const AttentionHeads heads{4, 2};
  const int64_t C = heads.out_width(hs), W = heads.qkv_width(hs);
  const DType bf = DType::bf16;
  const int64_t bslice = 2 * T * T + 7 * T * hs;
  EXPECT_EQ(attention_backward_workspace_bytes(B, T, C, heads, bf, bf, bf, bf),
            static_cast<size_t>(std::min<int64_t>(omp_get_max_threads(), B * 2) * bslice * 4));
  EXPECT_EQ(attention_backward_workspace_bytes(B, T, C, heads),
            static_cast<size_t>(std::min<int64_t>(omp_get_max_threads(), B * 2) * T * T * 4));
  const int64_t fslice = 3 * T * hs + T * T + T * hs;
  EXPECT_EQ(attention_forward_workspace_bytes(B, T, C, heads, bf, bf, bf),
            static_cast<size_t>(std::min<int64_t>(omp_get_max_threads(), B * 4) * fslice * 4));
  Tensor qkv = random_any(pool, {B, T, W}, bf, 1);
  Tensor out = make_tensor(pool, {B, T, C}, bf), att = make_tensor(pool, {B, 4, T, T}, bf);
  Tensor one = make_tensor(pool, {fslice});
  attention_forward(out, att, qkv, one, heads);
  Tensor dout = random_any(pool, {B, T, C}, bf, 2), dqkv = make_tensor(pool, {B, T, W}, bf);
  Tensor bsmall = make_tensor(pool, {bslice - 1}), bone = make_tensor(pool, {bslice});
  EXPECT_THROW(attention_backward(dqkv, dout, qkv, att, bsmall, heads), ShapeError);
  EXPECT_NO_THROW(attention_backward(dqkv, dout, qkv, att, bone, heads));
}

TEST(AttentionMixed, DTypeErrors) {
  MemoryPool pool;
  Tensor qkv = make_tensor(pool, {1, 4, 24}, DType::bf16), ws = make_tensor(pool, {1024});
  Tensor out = make_tensor(pool, {1, 4, 8}, DType::bf16);
  Tensor att_i = make_tensor(pool, {1, 1, 4, 4}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { attention_forward(out, att_i, qkv, ws, 1); },
                                      {"[attention]", "att", "f32, bf16 or f16", "i32"}));
  Tensor qkv_i = make_tensor(pool, {1, 4, 24}, DType::i8), att = make_tensor(pool, {1, 1, 4, 4});
  EXPECT_TRUE(throws_with<DTypeError>([&] { attention_forward(out, att, qkv_i, ws, 1); },
                                      {"[attention]", "qkv", "i8"}));
  Tensor ws_bf = make_tensor(pool, {1024}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { attention_forward(out, att, qkv, ws_bf, 1); },
                                      {"[attention]", "workspace", "f32", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
