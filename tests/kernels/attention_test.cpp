// Tests of plain causal attention: the fast kernel against the double-precision reference over
// odd shapes (T = 1, T = 17, one head, head sizes 8 to 160), the reference's backward against
// finite differences, the workspace contract and the typed errors on bad arguments; and the same
// for grouped-query heads, which must also equal multi-head attention on key/value heads
// repeated (Hugging Face's repeat_kv), not depend on the thread count, and leave kv == q
// bit-identical to the int call.
#include "memfit/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "matmul_test_util.h"
#include "memfit/kernels/ref/attention_ref.h"

namespace memfit::kernels {
namespace {

using matmul_test::random_doubles;
using matmul_test::random_tensor;
using matmul_test::rel_error;
using matmul_test::to_double;

constexpr double kTol = 1e-5;

struct AttnShape {
  int64_t B, T, C;
  int NH;
};
// hs = C / NH: 8, 24, 64, 128 (two 64-wide output passes) and 160 (two depth chunks).
const AttnShape kShapes[] = {{1, 1, 8, 1},   {2, 17, 48, 2},  {1, 17, 8, 1},  {2, 33, 64, 8},
                             {1, 40, 72, 3}, {2, 64, 128, 2}, {1, 45, 256, 2}, {1, 21, 320, 2}};

size_t workspace_floats(const AttnShape& s) {
  return attention_backward_workspace_bytes(s.B, s.T, s.C, s.NH) / sizeof(float);
}

TEST(Attention, ForwardMatchesReference) {
  MemoryPool pool;
  for (const auto& s : kShapes) {
    SCOPED_TRACE(fmt::format("B={} T={} C={} NH={}", s.B, s.T, s.C, s.NH));
    Tensor qkv = random_tensor(pool, {s.B, s.T, 3 * s.C}, 1);
    // Garbage in the outputs: the kernel must overwrite every element, zeros above the diagonal.
    Tensor out = random_tensor(pool, {s.B, s.T, s.C}, 2);
    Tensor att = random_tensor(pool, {s.B, s.NH, s.T, s.T}, 3);
    attention_forward(out, att, qkv, s.NH);
    std::vector<double> want_out(out.numel()), want_att(att.numel());
    ref::attention_forward(want_out.data(), want_att.data(), to_double(qkv).data(), s.B, s.T, s.C,
                           s.NH);
    EXPECT_LT(rel_error(out, want_out), kTol);
    EXPECT_LT(rel_error(att, want_att), kTol);
  }
}

TEST(Attention, BackwardMatchesReference) {
  MemoryPool pool;
  for (const auto& s : kShapes) {
    SCOPED_TRACE(fmt::format("B={} T={} C={} NH={}", s.B, s.T, s.C, s.NH));
    Tensor qkv = random_tensor(pool, {s.B, s.T, 3 * s.C}, 1);
    Tensor out = Tensor::empty(pool, {s.B, s.T, s.C}, DType::f32, Category::activations, "out");
    Tensor att =
        Tensor::empty(pool, {s.B, s.NH, s.T, s.T}, DType::f32, Category::activations, "att");
    attention_forward(out, att, qkv, s.NH);
    Tensor dout = random_tensor(pool, {s.B, s.T, s.C}, 4);
    Tensor dqkv = random_tensor(pool, {s.B, s.T, 3 * s.C}, 5);  // overwritten (=)
    Tensor ws = random_tensor(pool, {static_cast<int64_t>(workspace_floats(s))}, 6);
    attention_backward(dqkv, dout, qkv, att, ws, s.NH);
    std::vector<double> want(dqkv.numel());
    ref::attention_backward(want.data(), to_double(dout).data(), to_double(qkv).data(),
                            to_double(att).data(), s.B, s.T, s.C, s.NH);
    EXPECT_LT(rel_error(dqkv, want), kTol);
  }
}

// A workspace of a single (T, T) slice is enough (it runs on one thread) and gives the same
// result; less than one slice is an error that says what to allocate.
TEST(Attention, WorkspaceOfOneSliceSuffices) {
  MemoryPool pool;
  const int64_t B = 2, T = 19, C = 32;
  const int NH = 4;
  Tensor qkv = random_tensor(pool, {B, T, 3 * C}, 1);
  Tensor out = Tensor::empty(pool, {B, T, C}, DType::f32, Category::activations, "out");
  Tensor att = Tensor::empty(pool, {B, NH, T, T}, DType::f32, Category::activations, "att");
  attention_forward(out, att, qkv, NH);
  Tensor dout = random_tensor(pool, {B, T, C}, 2);
  Tensor full = Tensor::empty(pool, {int64_t(attention_backward_workspace_bytes(B, T, C, NH) / 4)},
                              DType::f32, Category::workspace, "ws");
  Tensor one = Tensor::empty(pool, {T, T}, DType::f32, Category::workspace, "ws");
  Tensor d1 = Tensor::empty(pool, {B, T, 3 * C}, DType::f32, Category::activations, "d1");
  Tensor d2 = Tensor::empty(pool, {B, T, 3 * C}, DType::f32, Category::activations, "d2");
  attention_backward(d1, dout, qkv, att, full, NH);
  attention_backward(d2, dout, qkv, att, one, NH);
  for (int64_t i = 0; i < d1.numel(); ++i) ASSERT_EQ(d1.data<float>()[i], d2.data<float>()[i]);

  Tensor small = Tensor::empty(pool, {T * T - 1}, DType::f32, Category::workspace, "ws");
  try {
    attention_backward(d2, dout, qkv, att, small, NH);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[attention] workspace (360,)"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(attention_backward_workspace_bytes(B, T, C, NH), size_t(T * T * 4));
}

// Finite differences of L = sum(out * g) with respect to qkv, all in double.
TEST(AttentionRef, GradientsMatchFiniteDifferences) {
  const int64_t B = 2, T = 5, C = 6, NH = 2;
  std::vector<double> qkv = random_doubles(B * T * 3 * C, 1), g = random_doubles(B * T * C, 2);
  std::vector<double> out(B * T * C), att(B * NH * T * T), dqkv(qkv.size());
  auto loss = [&] {
    ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * g[i];
    return l;
  };
  loss();
  ref::attention_backward(dqkv.data(), g.data(), qkv.data(), att.data(), B, T, C, NH);
  const double eps = 1e-6;
  for (size_t i = 0; i < qkv.size(); ++i) {
    const double x0 = qkv[i];
    qkv[i] = x0 + eps;
    const double lp = loss();
    qkv[i] = x0 - eps;
    const double lm = loss();
    qkv[i] = x0;
    EXPECT_NEAR((lp - lm) / (2 * eps), dqkv[i], 1e-8) << "dqkv[" << i << "]";
  }
}

// ---- grouped-query attention

struct GqaShape {
  int64_t B, T, hs;
  int q, kv;
  AttentionHeads heads() const { return {q, kv}; }
  int64_t C() const { return q * hs; }
  int64_t W() const { return (q + 2L * kv) * hs; }
};
// Groups of 3, 4, 2 and 1 (kv == q through the two-argument constructor); T = 1 and odd T; head
// sizes 8 to 160.
const GqaShape kGqaShapes[] = {{1, 1, 8, 4, 1},   {2, 17, 8, 6, 2},   {2, 33, 24, 4, 1},
                               {1, 40, 64, 6, 3}, {1, 21, 160, 4, 2}, {2, 19, 16, 3, 3}};

std::string name_of(const GqaShape& s) {
  return fmt::format("B={} T={} hs={} q={} kv={}", s.B, s.T, s.hs, s.q, s.kv);
}

// Multi-head qkv (B, T, 3C) from grouped-query qkv: each query head gets a copy of its key/value
// head, as Hugging Face's repeat_kv does.
Tensor repeat_kv(MemoryPool& pool, const Tensor& qkv, const GqaShape& s) {
  Tensor r = Tensor::empty(pool, {s.B, s.T, 3 * s.C()}, DType::f32, Category::activations, "r");
  const AttentionHeads heads = s.heads();
  for (int64_t row = 0; row < s.B * s.T; ++row) {
    const float* src = qkv.data<float>() + row * s.W();
    float* dst = r.data<float>() + row * 3 * s.C();
    std::memcpy(dst, src, s.C() * sizeof(float));
    for (int h = 0; h < s.q; ++h) {
      const int64_t g = heads.kv_of(h);
      std::memcpy(dst + s.C() + h * s.hs, src + s.C() + g * s.hs, s.hs * sizeof(float));
      std::memcpy(dst + 2 * s.C() + h * s.hs, src + s.C() + (s.kv + g) * s.hs,
                  s.hs * sizeof(float));
    }
  }
  return r;
}

Tensor copy_of(MemoryPool& pool, const Tensor& t) {
  Tensor c = Tensor::empty(pool, t.shape(), t.dtype(), Category::activations, "copy");
  std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Forward and backward of one grouped-query shape on seeded inputs.
struct GqaRun {
  MemoryPool pool;
  GqaShape s;
  Tensor qkv, dout, out, att, dqkv;
  explicit GqaRun(const GqaShape& shape) : s(shape) {
    qkv = random_tensor(pool, {s.B, s.T, s.W()}, 1);
    dout = random_tensor(pool, {s.B, s.T, s.C()}, 4);
    out = random_tensor(pool, {s.B, s.T, s.C()}, 2);  // garbage: overwritten
    att = random_tensor(pool, {s.B, s.q, s.T, s.T}, 3);
    dqkv = random_tensor(pool, {s.B, s.T, s.W()}, 5);
  }
  void run() {
    attention_forward(out, att, qkv, s.heads());
    Tensor ws = Tensor::empty(
        pool, {int64_t(attention_backward_workspace_bytes(s.B, s.T, s.C(), s.heads()) / 4)},
        DType::f32, Category::workspace, "ws");
    attention_backward(dqkv, dout, qkv, att, ws, s.heads());
  }
};

TEST(Attention, GqaMatchesReference) {
  for (const auto& s : kGqaShapes) {
    SCOPED_TRACE(name_of(s));
    GqaRun r(s);
    r.run();
    std::vector<double> want_out(r.out.numel()), want_att(r.att.numel()), want(r.dqkv.numel());
    ref::attention_forward(want_out.data(), want_att.data(), to_double(r.qkv).data(), s.B, s.T,
                           s.C(), s.heads());
    ref::attention_backward(want.data(), to_double(r.dout).data(), to_double(r.qkv).data(),
                            to_double(r.att).data(), s.B, s.T, s.C(), s.heads());
    EXPECT_LT(rel_error(r.out, want_out), kTol);
    EXPECT_LT(rel_error(r.att, want_att), kTol);
    EXPECT_LT(rel_error(r.dqkv, want), kTol);
  }
}

// Grouped-query attention is multi-head attention on repeated key/value heads: out, att and dq
// bit for bit (the same arithmetic per query head), and dk, dv of a key/value head the sum over
// its query heads, added in head order as the kernel does, so also bit for bit.
TEST(Attention, GqaIsMultiHeadOnRepeatedKeyValueHeads) {
  for (const auto& s : kGqaShapes) {
    SCOPED_TRACE(name_of(s));
    GqaRun r(s);
    r.run();
    MemoryPool& pool = r.pool;
    Tensor qkv3 = repeat_kv(pool, r.qkv, s);
    Tensor out = Tensor::empty(pool, {s.B, s.T, s.C()}, DType::f32, Category::activations, "o");
    Tensor att = Tensor::empty(pool, {s.B, s.q, s.T, s.T}, DType::f32, Category::activations, "a");
    Tensor d3 =
        Tensor::empty(pool, {s.B, s.T, 3 * s.C()}, DType::f32, Category::activations, "d");
    Tensor ws = Tensor::empty(
        pool, {int64_t(attention_backward_workspace_bytes(s.B, s.T, s.C(), s.q) / 4)},
        DType::f32, Category::workspace, "ws");
    attention_forward(out, att, qkv3, s.q);
    attention_backward(d3, r.dout, qkv3, att, ws, s.q);
    EXPECT_TRUE(same_bits(out, r.out));
    EXPECT_TRUE(same_bits(att, r.att));
    const AttentionHeads heads = s.heads();
    for (int64_t row = 0; row < s.B * s.T; ++row) {
      const float* got = r.dqkv.data<float>() + row * s.W();
      const float* mha = d3.data<float>() + row * 3 * s.C();
      for (int64_t e = 0; e < s.C(); ++e) ASSERT_EQ(got[e], mha[e]) << "dq row " << row;
      for (int part = 1; part <= 2; ++part) {
        for (int g = 0; g < s.kv; ++g) {
          for (int64_t e = 0; e < s.hs; ++e) {
            float sum = 0.0f;
            for (int i = 0; i < heads.group(); ++i) {
              const float x = mha[part * s.C() + (g * heads.group() + i) * s.hs + e];
              sum = i == 0 ? x : sum + x;
            }
            ASSERT_EQ(got[s.C() + ((part - 1) * s.kv + g) * s.hs + e], sum)
                << (part == 1 ? "dk" : "dv") << " row " << row << " kv head " << g;
          }
        }
      }
    }
  }
}

// Each (b, query head) of forward and (b, key/value head) of backward is one task's, summed in a
// fixed order: the same bits from run to run and at any thread count.
TEST(Attention, GqaIsBitIdenticalAtAnyThreadCount) {
  const GqaShape s{2, 37, 16, 6, 2};
  GqaRun r(s);
  r.run();
  Tensor out0 = copy_of(r.pool, r.out), att0 = copy_of(r.pool, r.att), d0 = copy_of(r.pool, r.dqkv);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 4}) {
    omp_set_num_threads(threads);
    for (int run = 0; run < 2; ++run) {
      r.run();
      EXPECT_TRUE(same_bits(r.out, out0)) << "threads " << threads;
      EXPECT_TRUE(same_bits(r.att, att0)) << "threads " << threads;
      EXPECT_TRUE(same_bits(r.dqkv, d0)) << "threads " << threads;
    }
  }
  omp_set_num_threads(saved);
}

// AttentionHeads{n, n} is the int call: the same bits.
TEST(Attention, EqualHeadsAreTheIntCall) {
  const GqaShape s{2, 29, 24, 4, 4};
  GqaRun r(s);
  r.run();  // through AttentionHeads{4, 4}
  MemoryPool& pool = r.pool;
  Tensor out = Tensor::empty(pool, {s.B, s.T, s.C()}, DType::f32, Category::activations, "o");
  Tensor att = Tensor::empty(pool, {s.B, s.q, s.T, s.T}, DType::f32, Category::activations, "a");
  Tensor d = Tensor::empty(pool, {s.B, s.T, s.W()}, DType::f32, Category::activations, "d");
  Tensor ws = Tensor::empty(
      pool, {int64_t(attention_backward_workspace_bytes(s.B, s.T, s.C(), 4) / 4)}, DType::f32,
      Category::workspace, "ws");
  EXPECT_EQ(attention_backward_workspace_bytes(s.B, s.T, s.C(), 4),
            attention_backward_workspace_bytes(s.B, s.T, s.C(), AttentionHeads{4, 4}));
  attention_forward(out, att, r.qkv, 4);
  attention_backward(d, r.dout, r.qkv, att, ws, 4);
  EXPECT_TRUE(same_bits(out, r.out));
  EXPECT_TRUE(same_bits(att, r.att));
  EXPECT_TRUE(same_bits(d, r.dqkv));
}

// Finite differences of L = sum(out * g) with respect to qkv through the reference, grouped.
TEST(AttentionRef, GqaGradientsMatchFiniteDifferences) {
  for (const AttentionHeads heads : {AttentionHeads{4, 2}, AttentionHeads{3, 1}}) {
    const int64_t B = 2, T = 5, hs = 3, C = heads.q * hs, W = heads.qkv_width(hs);
    std::vector<double> qkv = random_doubles(B * T * W, 1), g = random_doubles(B * T * C, 2);
    std::vector<double> out(B * T * C), att(B * heads.q * T * T), dqkv(qkv.size());
    auto loss = [&] {
      ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, heads);
      double l = 0.0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * g[i];
      return l;
    };
    loss();
    ref::attention_backward(dqkv.data(), g.data(), qkv.data(), att.data(), B, T, C, heads);
    const double eps = 1e-6;
    for (size_t i = 0; i < qkv.size(); ++i) {
      const double x0 = qkv[i];
      qkv[i] = x0 + eps;
      const double lp = loss();
      qkv[i] = x0 - eps;
      const double lm = loss();
      qkv[i] = x0;
      EXPECT_NEAR((lp - lm) / (2 * eps), dqkv[i], 1e-8)
          << "q " << heads.q << " kv " << heads.kv << " dqkv[" << i << "]";
    }
  }
}

// ---- errors

template <typename E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

TEST(Attention, BadShapesAreShapeErrors) {
  MemoryPool pool;
  Tensor qkv = random_tensor(pool, {2, 8, 48}, 1);  // C = 16
  Tensor out = Tensor::empty(pool, {2, 8, 16}, DType::f32, Category::activations, "out");
  Tensor att = Tensor::empty(pool, {2, 2, 8, 8}, DType::f32, Category::activations, "att");
  std::string msg = message_of<ShapeError>([&] { attention_forward(out, att, qkv, 3); });
  EXPECT_NE(msg.find("[attention] C = 16 (qkv (2, 8, 48)) is not divisible by n_head = 3"),
            std::string::npos)
      << msg;
  Tensor bad_qkv = random_tensor(pool, {2, 8, 47}, 2);
  EXPECT_THROW(attention_forward(out, att, bad_qkv, 2), ShapeError);
  Tensor bad_att = Tensor::empty(pool, {2, 2, 8, 7}, DType::f32, Category::activations, "att");
  msg = message_of<ShapeError>([&] { attention_forward(out, bad_att, qkv, 2); });
  EXPECT_NE(msg.find("[attention] att must be (2, 2, 8, 8), got (2, 2, 8, 7)"), std::string::npos)
      << msg;
  Tensor bad_out = Tensor::empty(pool, {2, 8, 48}, DType::f32, Category::activations, "out");
  EXPECT_THROW(attention_forward(bad_out, att, qkv, 2), ShapeError);

  attention_forward(out, att, qkv, 2);
  Tensor ws = Tensor::empty(pool, {64}, DType::f32, Category::workspace, "ws");
  Tensor dqkv = Tensor::empty(pool, {2, 8, 48}, DType::f32, Category::activations, "dqkv");
  EXPECT_THROW(attention_backward(dqkv, qkv, qkv, att, ws, 2), ShapeError);  // dout (B,T,3C)
  EXPECT_THROW(attention_backward(out, out, qkv, att, ws, 2), ShapeError);   // dqkv (B,T,C)
}

TEST(Attention, WrongDtypesAreDTypeErrors) {
  MemoryPool pool;
  Tensor qkv = Tensor::empty(pool, {1, 4, 24}, DType::bf16, Category::activations, "qkv");
  Tensor out = Tensor::empty(pool, {1, 4, 8}, DType::f32, Category::activations, "out");
  Tensor att = Tensor::empty(pool, {1, 1, 4, 4}, DType::f32, Category::activations, "att");
  std::string msg = message_of<DTypeError>([&] { attention_forward(out, att, qkv, 1); });
  EXPECT_NE(msg.find("[attention] qkv must be f32, got bf16 (1, 4, 24)"), std::string::npos)
      << msg;
  Tensor qkv32 = random_tensor(pool, {1, 4, 24}, 1);
  Tensor ws = Tensor::empty(pool, {16}, DType::i32, Category::workspace, "ws");
  Tensor dqkv = Tensor::empty(pool, {1, 4, 24}, DType::f32, Category::activations, "dqkv");
  attention_forward(out, att, qkv32, 1);
  EXPECT_THROW(attention_backward(dqkv, out, qkv32, att, ws, 1), DTypeError);
}

TEST(Attention, GqaBadShapesAreShapeErrors) {
  MemoryPool pool;
  const AttentionHeads heads{4, 2};  // hs 8: qkv (B, T, 64), out (B, T, 32), att (B, 4, T, T)
  Tensor qkv = random_tensor(pool, {2, 8, 64}, 1);
  Tensor out = Tensor::empty(pool, {2, 8, 32}, DType::f32, Category::activations, "out");
  Tensor att = Tensor::empty(pool, {2, 4, 8, 8}, DType::f32, Category::activations, "att");
  attention_forward(out, att, qkv, heads);
  std::string msg = message_of<ShapeError>(
      [&] { attention_forward(out, att, qkv, AttentionHeads{4, 3}); });
  EXPECT_NE(msg.find("[attention] 3 key/value heads must divide 4 query heads (qkv (2, 8, 64))"),
            std::string::npos)
      << msg;
  Tensor bad_qkv = random_tensor(pool, {2, 8, 60}, 2);
  msg = message_of<ShapeError>([&] { attention_forward(out, att, bad_qkv, heads); });
  EXPECT_NE(msg.find("qkv must be (B, T, (q + 2 kv) * hs) = (B, T, 8 hs) for 4 query heads and 2 "
                     "key/value heads, got (2, 8, 60)"),
            std::string::npos)
      << msg;
  // att has a plane per query head, not per key/value head.
  Tensor kv_att = Tensor::empty(pool, {2, 2, 8, 8}, DType::f32, Category::activations, "att");
  msg = message_of<ShapeError>([&] { attention_forward(out, kv_att, qkv, heads); });
  EXPECT_NE(msg.find("att must be (2, 4, 8, 8), got (2, 2, 8, 8)"), std::string::npos) << msg;
  Tensor ws = Tensor::empty(pool, {1024}, DType::f32, Category::workspace, "ws");
  Tensor dqkv = Tensor::empty(pool, {2, 8, 64}, DType::f32, Category::activations, "dqkv");
  Tensor dout3 = Tensor::empty(pool, {2, 8, 96}, DType::f32, Category::activations, "dout");
  msg = message_of<ShapeError>([&] { attention_backward(dqkv, dout3, qkv, att, ws, heads); });
  EXPECT_NE(msg.find("dout must be (2, 8, 32), got (2, 8, 96)"), std::string::npos) << msg;
  EXPECT_THROW(attention_backward(out, out, qkv, att, ws, heads), ShapeError);  // dqkv (B,T,C)
}

}  // namespace
}  // namespace memfit::kernels
