// The vocabulary-parallel cross-entropy's local passes: one slice holding the whole vocabulary
// gives the plain kernel's bits (loss and gradient, masked rows, bf16 rounding), and slices of
// a vocabulary split as T ranks would hold it, combined here in rank order without any
// communicator, give the double reference's loss and gradient within 1e-6 on large logits,
// padding garbage (NaN, huge values) never read into the max or the sum and its gradient 0.
#include "memfit/kernels/cpu/crossentropy_slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/ref/crossentropy_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

std::vector<float> floats_of(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

// The slice passes on one slice [0, Vp) of a vocabulary of V, as one rank would run them.
void whole_slice_forward_backward(Tensor& losses, Tensor& logits, const Tensor& targets,
                                  int64_t V, float dloss, DType round_to, const Tensor* mask) {
  const size_t R = static_cast<size_t>(logits.size(0));
  std::vector<float> mx(R);
  std::vector<double> sums(R), xt(R);
  const VocabSliceView slice{0, V};
  crossentropy_slice_max(mx, logits, targets, slice, mask);
  crossentropy_slice_sum_exp(sums, xt, logits, targets, mx, slice, /*store=*/true, mask);
  crossentropy_slice_loss(losses, mx, sums, xt, mask);
  crossentropy_slice_backward(logits, targets, sums, slice, dloss, round_to, mask);
}

TEST(CrossEntropySlice, TheWholeVocabularyIsThePlainKernelBitForBit) {
  MemoryPool pool;
  const int64_t R = 7, Vp = 5000, V = 4931;  // past the 2048-column blocks, odd tail
  for (DType round_to : {DType::f32, DType::bf16}) {
    for (bool masked : {false, true}) {
      std::vector<double> x = random_values(R * Vp, 3, 80, 100);
      Tensor a = make_tensor(pool, {R, Vp}), b = make_tensor(pool, {R, Vp});
      copy_in(a, x);
      copy_in(b, x);
      Tensor targets = make_tensor(pool, {R}, DType::i32);
      copy_in(targets, random_ids(R, 4, static_cast<int32_t>(V)));
      Tensor mask = make_tensor(pool, {R}, DType::u8);
      for (int64_t r = 0; r < R; ++r) mask.data<uint8_t>()[r] = r % 3 != 1;
      const Tensor* m = masked ? &mask : nullptr;
      Tensor la = make_tensor(pool, {R}), lb = make_tensor(pool, {R});
      crossentropy_forward_backward(la, a, targets, V, 0.25f, round_to, m);
      whole_slice_forward_backward(lb, b, targets, V, 0.25f, round_to, m);
      EXPECT_EQ(floats_of(la), floats_of(lb)) << dtype_name(round_to) << " masked " << masked;
      EXPECT_EQ(floats_of(a), floats_of(b)) << dtype_name(round_to) << " masked " << masked;
      // And the forward alone.
      Tensor c = make_tensor(pool, {R, Vp}), lc = make_tensor(pool, {R}), ld = make_tensor(pool, {R});
      copy_in(c, x);
      crossentropy_forward(lc, c, targets, V, m);
      std::vector<float> mx(R);
      std::vector<double> sums(R), xt(R);
      crossentropy_slice_max(mx, c, targets, {0, V}, m);
      crossentropy_slice_sum_exp(sums, xt, c, targets, mx, {0, V}, /*store=*/false, m);
      crossentropy_slice_loss(ld, mx, sums, xt, m);
      EXPECT_EQ(floats_of(lc), floats_of(ld));
      EXPECT_EQ(to_doubles(c), x);  // without store the logits are only read
    }
  }
}

struct SplitCase {
  int64_t R, V;
  int ranks;
  int64_t width;  // each slice's columns: ranks * width >= V
};

class CrossEntropySliceSplit : public ::testing::TestWithParam<SplitCase> {};

// The ranks' passes run one after another here, their statistics combined as the tensor group
// combines them (max; sums in rank order).
TEST_P(CrossEntropySliceSplit, CombinedSlicesMatchTheReference) {
  const auto [R, V, ranks, width] = GetParam();
  MemoryPool pool;
  const int64_t Vp = ranks * width;
  std::vector<double> x = random_values(R * Vp, 11, 80, 100);
  for (int64_t r = 0; r < R; ++r)  // padding garbage that must not be read into the row
    for (int64_t i = V; i < Vp; ++i)
      x[r * Vp + i] = i % 2 ? 1e4 : std::numeric_limits<double>::quiet_NaN();
  const std::vector<int32_t> tg = random_ids(R, 12, static_cast<int32_t>(V));
  Tensor targets = make_tensor(pool, {R}, DType::i32);
  copy_in(targets, tg);
  const float dloss = 1.0f / static_cast<float>(R);

  std::vector<Tensor> slices;
  for (int q = 0; q < ranks; ++q) {
    Tensor s = make_tensor(pool, {R, width});
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < width; ++j)
        s.data<float>()[r * width + j] = static_cast<float>(x[r * Vp + q * width + j]);
    slices.push_back(s);
  }
  auto view = [&](int q) { return VocabSliceView{q * width, V}; };
  std::vector<float> mx(R, -std::numeric_limits<float>::infinity()), part(R);
  for (int q = 0; q < ranks; ++q) {
    crossentropy_slice_max(part, slices[q], targets, view(q));
    for (int64_t r = 0; r < R; ++r) mx[r] = std::max(mx[r], part[r]);
  }
  std::vector<double> sums(R, 0.0), xt(R, 0.0), ps(R), pt(R);
  for (int q = 0; q < ranks; ++q) {
    crossentropy_slice_sum_exp(ps, pt, slices[q], targets, mx, view(q), /*store=*/true);
    for (int64_t r = 0; r < R; ++r) {
      sums[r] += ps[r];
      xt[r] += pt[r];
    }
  }
  Tensor losses = make_tensor(pool, {R});
  crossentropy_slice_loss(losses, mx, sums, xt);
  for (int q = 0; q < ranks; ++q)
    crossentropy_slice_backward(slices[q], targets, sums, view(q), dloss);

  std::vector<double> want(R), dwant(R * Vp);
  ref::crossentropy_forward_ref(want.data(), x.data(), tg.data(), R, Vp, V);
  ref::crossentropy_backward_ref(dwant.data(), x.data(), tg.data(), R, Vp, V, dloss);
  EXPECT_TRUE(all_close(to_doubles(losses), want, 1e-6, 0));
  std::vector<double> got(R * Vp);
  for (int q = 0; q < ranks; ++q)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < width; ++j)
        got[r * Vp + q * width + j] = slices[q].data<float>()[r * width + j];
  EXPECT_TRUE(all_close(got, dwant, 1e-6, 1e-12));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = V; i < Vp; ++i) ASSERT_EQ(got[r * Vp + i], 0.0) << r << ", " << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropySliceSplit,
                         ::testing::Values(SplitCase{5, 1001, 2, 501},   // one padding column
                                           SplitCase{3, 4099, 4, 1025},  // past a block edge
                                           SplitCase{4, 5, 4, 2},        // the last slice all padding
                                           SplitCase{2, 7, 3, 3}));

TEST(CrossEntropySlice, TargetsOutsideTheVocabularyAndWrongLengthsAreRefused) {
  MemoryPool pool;
  Tensor logits = make_tensor(pool, {2, 4}), targets = make_tensor(pool, {2}, DType::i32);
  copy_in(targets, std::vector<int32_t>{0, 9});
  std::vector<float> mx(2);
  EXPECT_THROW(crossentropy_slice_max(mx, logits, targets, {4, 8}), Error);
  copy_in(targets, std::vector<int32_t>{0, 1});
  std::vector<float> short_mx(1);
  EXPECT_THROW(crossentropy_slice_max(short_mx, logits, targets, {4, 8}), ShapeError);
  EXPECT_THROW(crossentropy_slice_max(mx, logits, targets, {-1, 8}), ShapeError);
  EXPECT_THROW(crossentropy_slice_backward(logits, targets, std::vector<double>(2, 1.0), {0, 8},
                                           1.0f, DType::i32),
               DTypeError);
}

}  // namespace
}  // namespace memfit::kernels
