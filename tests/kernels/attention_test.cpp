// Tests of plain causal attention: the fast kernel against the double-precision reference over
// odd shapes (T = 1, T = 17, one head, head sizes 8 to 160), the reference's backward against
// finite differences, the workspace contract and the typed errors on bad arguments.
#include "memfit/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

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

}  // namespace
}  // namespace memfit::kernels
