// Cross-entropy with a loss mask (docs/data.md, "Loss masks"): masked-out rows have loss 0 and
// a gradient row of exact zeros, masked-in rows the bits of the unmasked kernel; the reference
// with a mask against finite differences of the masked loss, and the fast kernel against it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/ref/crossentropy_ref.h"
#include "mixed_test_util.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

Tensor make_mask(MemoryPool& pool, const std::vector<uint8_t>& m) {
  Tensor t = make_tensor(pool, {static_cast<int64_t>(m.size())}, DType::u8);
  std::memcpy(t.data<uint8_t>(), m.data(), m.size());
  return t;
}

TEST(CrossEntropyMaskRef, BackwardMatchesFiniteDifferencesOfTheMaskedLoss) {
  const int64_t R = 4, Vp = 9, V = 7;
  const double dloss = 0.25;
  const std::vector<uint8_t> mask = {1, 0, 0, 1};
  std::vector<double> x = random_values(R * Vp, 3, -3, 3);
  const std::vector<int32_t> tg = {0, 6, 3, 2};
  std::vector<double> losses(R);
  auto loss = [&] {
    ref::crossentropy_forward_ref(losses.data(), x.data(), tg.data(), R, Vp, V, mask.data());
    double s = 0.0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  std::vector<double> dx(R * Vp, -1.0);
  ref::crossentropy_backward_ref(dx.data(), x.data(), tg.data(), R, Vp, V, dloss, mask.data());
  EXPECT_TRUE(all_close(dx, numeric_grad(loss, x), 1e-6, 1e-9));
  for (int64_t i = 0; i < Vp; ++i) EXPECT_EQ(dx[1 * Vp + i], 0.0);
  // By hand: the masked loss is the sum of rows 0 and 3 of the unmasked one.
  std::vector<double> all(R);
  ref::crossentropy_forward_ref(all.data(), x.data(), tg.data(), R, Vp, V);
  loss();
  EXPECT_EQ(losses[0] + losses[1] + losses[2] + losses[3], all[0] + all[3]);
}

// Each entry point, f32 and mixed: masked-in rows bit-identical to the unmasked call, masked-out
// rows 0 in the loss and the whole gradient row (padding too), whatever the row held.
TEST(CrossEntropyMask, MaskedOutRowsAreZeroAndTheRestUnchanged) {
  const int64_t R = 6, Vp = 40, V = 37;
  MemoryPool pool;
  const std::vector<uint8_t> m = {0, 1, 1, 0, 1, 0};
  const std::vector<double> x = random_values(R * Vp, 11, -6, 6);
  const std::vector<int32_t> tg = random_ids(R, 12, static_cast<int32_t>(V));
  Tensor mask = make_mask(pool, m), targets = make_tensor(pool, {R}, DType::i32);
  copy_in(targets, tg);
  auto run = [&](bool masked, DType dlogits_type) {
    Tensor logits = make_tensor(pool, {R, Vp}), losses = make_tensor(pool, {R});
    copy_in(logits, x);
    const Tensor* mk = masked ? &mask : nullptr;
    if (dlogits_type == DType::f32) {
      crossentropy_forward_backward(losses, logits, targets, V, 0.5f, DType::f32, mk);
      return std::pair(to_doubles(losses), to_doubles(logits));
    }
    Tensor d = make_tensor(pool, {R, Vp}, dlogits_type);
    crossentropy_forward_backward(losses, d, logits, targets, V, 0.5f, mk);
    return std::pair(to_doubles(losses), to_doubles_any(d));
  };
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(type));
    const auto [loss0, grad0] = run(false, type);
    const auto [loss1, grad1] = run(true, type);
    for (int64_t r = 0; r < R; ++r) {
      EXPECT_EQ(loss1[r], m[r] ? loss0[r] : 0.0) << "row " << r;
      for (int64_t i = 0; i < Vp; ++i)
        EXPECT_EQ(grad1[r * Vp + i], m[r] ? grad0[r * Vp + i] : 0.0) << r << "," << i;
    }
  }
  Tensor logits = make_tensor(pool, {R, Vp}), losses = make_tensor(pool, {R}),
         plain = make_tensor(pool, {R});
  copy_in(logits, x);
  crossentropy_forward(plain, logits, targets, V);
  crossentropy_forward(losses, logits, targets, V, &mask);
  for (int64_t r = 0; r < R; ++r)
    EXPECT_EQ(to_doubles(losses)[r], m[r] ? to_doubles(plain)[r] : 0.0);
}

TEST(CrossEntropyMask, FastMatchesTheReference) {
  const int64_t R = 9, Vp = 1000, V = 999;
  MemoryPool pool;
  std::vector<uint8_t> m(R);
  for (int64_t r = 0; r < R; ++r) m[r] = (r * 7 + 3) % 3 != 0;
  const std::vector<double> x = random_values(R * Vp, 31, -8, 8);
  const std::vector<int32_t> tg = random_ids(R, 32, static_cast<int32_t>(V));
  Tensor mask = make_mask(pool, m), targets = make_tensor(pool, {R}, DType::i32);
  Tensor logits = make_tensor(pool, {R, Vp}), losses = make_tensor(pool, {R});
  copy_in(targets, tg);
  copy_in(logits, x);
  std::vector<double> want(R), dwant(R * Vp);
  ref::crossentropy_forward_ref(want.data(), x.data(), tg.data(), R, Vp, V, m.data());
  ref::crossentropy_backward_ref(dwant.data(), x.data(), tg.data(), R, Vp, V, 0.125, m.data());
  crossentropy_forward_backward(losses, logits, targets, V, 0.125f, DType::f32, &mask);
  EXPECT_TRUE(all_close(to_doubles(losses), want, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(to_doubles(logits), dwant, 1e-5, 1e-10));
}

TEST(CrossEntropyMask, RejectsABadMask) {
  MemoryPool pool;
  Tensor logits = make_tensor(pool, {2, 4}), losses = make_tensor(pool, {2});
  Tensor targets = make_tensor(pool, {2}, DType::i32);
  copy_in(targets, std::vector<int32_t>{0, 1});
  Tensor two = make_mask(pool, {1, 2}), short_mask = make_mask(pool, {1});
  EXPECT_THROW(crossentropy_forward(losses, logits, targets, 4, &two), Error);
  EXPECT_THROW(crossentropy_forward(losses, logits, targets, 4, &short_mask), Error);
}

}  // namespace
}  // namespace memfit::kernels
