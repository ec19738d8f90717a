// Cross-entropy: the double reference against finite differences, the fast kernel against the
// reference (padding ignored and zeroed, extreme logits stable, GPT-2's V = 50257), and typed
// errors for bad shapes, dtypes and targets.
#include "memfit/kernels/cpu/crossentropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "memfit/kernels/ref/crossentropy_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

TEST(CrossEntropyRef, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, Vp = 9, V = 7;
  const double dloss = 0.37;
  std::vector<double> x = random_values(R * Vp, 1, -3, 3);
  const std::vector<int32_t> tg = {0, 6, 3};
  std::vector<double> losses(R);
  auto loss = [&] {
    ref::crossentropy_forward_ref(losses.data(), x.data(), tg.data(), R, Vp, V);
    double s = 0.0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  std::vector<double> dx(R * Vp, -1.0);
  ref::crossentropy_backward_ref(dx.data(), x.data(), tg.data(), R, Vp, V, dloss);
  // Padding columns do not enter the loss, so their numeric gradient is 0 as well.
  EXPECT_TRUE(all_close(dx, numeric_grad(loss, x), 1e-6, 1e-9));
}

struct CeCase {
  int64_t R, Vp, V;
};

class CrossEntropyFast : public ::testing::TestWithParam<CeCase> {};

TEST_P(CrossEntropyFast, MatchesReference) {
  const auto [R, Vp, V] = GetParam();
  MemoryPool pool;
  std::vector<double> x = random_values(R * Vp, 21, -8, 8);
  // Padding holds garbage that must neither win the max nor reach the sum.
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = V; i < Vp; ++i)
      x[r * Vp + i] = (i % 2) ? 1e4 : std::numeric_limits<double>::quiet_NaN();
  }
  const std::vector<int32_t> tg = random_ids(R, 22, static_cast<int32_t>(V));
  Tensor logits = make_tensor(pool, {R, Vp}), targets = make_tensor(pool, {R}, DType::i32);
  Tensor losses = make_tensor(pool, {R}), losses_fb = make_tensor(pool, {R});
  copy_in(logits, x);
  copy_in(targets, tg);

  std::vector<double> want(R);
  ref::crossentropy_forward_ref(want.data(), x.data(), tg.data(), R, Vp, V);
  crossentropy_forward(losses, logits, targets, V);
  EXPECT_TRUE(all_close(to_doubles(losses), want, 1e-6, 1e-6)) << "forward";

  const double dloss = 1.0 / 3.0;
  std::vector<double> dwant(R * Vp);
  ref::crossentropy_backward_ref(dwant.data(), x.data(), tg.data(), R, Vp, V, dloss);
  crossentropy_forward_backward(losses_fb, logits, targets, V, static_cast<float>(dloss));
  // The same sums in both entry points: the losses agree exactly.
  EXPECT_EQ(to_doubles(losses_fb), to_doubles(losses));
  EXPECT_TRUE(all_close(to_doubles(logits), dwant, 1e-5, 1e-10)) << "gradient";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyFast,
                         ::testing::Values(CeCase{1, 1, 1}, CeCase{1, 16, 16}, CeCase{3, 17, 13},
                                           CeCase{5, 100, 97}, CeCase{2, 64, 33},
                                           CeCase{64, 1000, 999}, CeCase{2, 50304, 50257}),
                         [](const auto& info) {
                           return std::to_string(info.param.R) + "x" +
                                  std::to_string(info.param.Vp) + "_V" +
                                  std::to_string(info.param.V);
                         });

TEST(CrossEntropy, LargeLogitsStayFinite) {
  MemoryPool pool;
  const int64_t R = 2, V = 40;
  std::vector<double> x = random_values(R * V, 5, -1, 1);
  for (int64_t i = 0; i < V; ++i) {
    x[i] += 1000.0;                        // every logit large: exp would overflow without the max
    x[V + i] = (i == 3) ? 80.0 : -1000.0;  // one logit dominates, the rest underflow
  }
  round_to_float(x);
  const std::vector<int32_t> tg = {7, 5};
  Tensor logits = make_tensor(pool, {R, V}), targets = make_tensor(pool, {R}, DType::i32),
         losses = make_tensor(pool, {R});
  copy_in(logits, x);
  copy_in(targets, tg);
  std::vector<double> want(R), dwant(R * V);
  ref::crossentropy_forward_ref(want.data(), x.data(), tg.data(), R, V, V);
  ref::crossentropy_backward_ref(dwant.data(), x.data(), tg.data(), R, V, V, 1.0);
  crossentropy_forward_backward(losses, logits, targets, V, 1.0f);
  EXPECT_TRUE(all_close(to_doubles(losses), want, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(to_doubles(logits), dwant, 1e-5, 1e-10));
}

TEST(CrossEntropy, TargetsOutsideTheVocabularyAreErrors) {
  MemoryPool pool;
  Tensor logits = make_tensor(pool, {2, 16}), targets = make_tensor(pool, {2}, DType::i32),
         losses = make_tensor(pool, {2});
  copy_in(targets, std::vector<int32_t>{3, 10});
  // 10 is a padding column when V = 10: not a real class.
  EXPECT_TRUE(throws_with<Error>([&] { crossentropy_forward(losses, logits, targets, 10); },
                                 {"[crossentropy_forward]", "target 10", "row 1", "[0, 10)"}));
  copy_in(targets, std::vector<int32_t>{-1, 0});
  EXPECT_TRUE(
      throws_with<Error>([&] { crossentropy_forward_backward(losses, logits, targets, 16, 1.0f); },
                         {"[crossentropy_forward_backward]", "target -1", "row 0"}));
}

TEST(CrossEntropy, ShapeAndDTypeErrors) {
  MemoryPool pool;
  Tensor logits = make_tensor(pool, {4, 16}), targets = make_tensor(pool, {4}, DType::i32),
         losses = make_tensor(pool, {4});
  Tensor targets_bad = make_tensor(pool, {5}, DType::i32), losses_bad = make_tensor(pool, {3});
  EXPECT_TRUE(
      throws_with<ShapeError>([&] { crossentropy_forward(losses, logits, targets_bad, 16); },
                              {"[crossentropy_forward]", "targets", "(4,)", "(5,)"}));
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { crossentropy_forward_backward(losses_bad, logits, targets, 16, 1.0f); },
      {"[crossentropy_forward_backward]", "losses", "(3,)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { crossentropy_forward(losses, logits, targets, 17); },
                                      {"[crossentropy_forward]", "V = 17", "(4, 16)"}));
  Tensor flat = make_tensor(pool, {64});
  EXPECT_TRUE(throws_with<ShapeError>([&] { crossentropy_forward(losses, flat, targets, 16); },
                                      {"[crossentropy_forward]", "(64,)"}));
  Tensor targets_f32 = make_tensor(pool, {4});
  EXPECT_TRUE(
      throws_with<DTypeError>([&] { crossentropy_forward(losses, logits, targets_f32, 16); },
                              {"[crossentropy_forward]", "targets", "i32", "f32"}));
  Tensor logits_bf16 = make_tensor(pool, {4, 16}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { crossentropy_forward_backward(losses, logits_bf16, targets, 16, 1.0f); },
      {"[crossentropy_forward_backward]", "logits", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
