// Cross-entropy writing a bf16 / f16 logit gradient (into a tensor of that type, or rounded in
// place in the f32 logits) and the embedding reading bf16 / f16 tables: each equals the f32
// kernel's result on the same values, rounded once to the output type where there is one (the
// f32 arithmetic is shared), and the double reference within that type's unit roundoff; plus
// the dtype errors.
#include <gtest/gtest.h>

#include <limits>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/cpu/embedding.h"
#include "memfit/kernels/ref/crossentropy_ref.h"
#include "memfit/kernels/ref/embedding_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

struct CeCase {
  int64_t R, Vp, V;
};

TEST(CrossEntropyMixed, HalfGradientIsTheF32GradientRounded) {
  MemoryPool pool;
  for (const auto& [R, Vp, V] :
       {CeCase{1, 1, 1}, CeCase{3, 40, 37}, CeCase{4, 1024, 1000}, CeCase{2, 50304, 50257}}) {
    std::vector<double> x = random_values(R * Vp, 21, -8, 8);
    for (int64_t r = 0; r < R; ++r)  // padding must neither win the max nor reach the sum
      for (int64_t i = V; i < Vp; ++i) x[r * Vp + i] = std::numeric_limits<double>::quiet_NaN();
    const std::vector<int32_t> tg = random_ids(R, 22, static_cast<int32_t>(V));
    Tensor targets = make_tensor(pool, {R}, DType::i32);
    copy_in(targets, tg);
    const float dloss = 65536.0f / 2048.0f;  // a loss scale of 2^16 over 2048 tokens
    Tensor ref_logits = make_tensor(pool, {R, Vp}), ref_losses = make_tensor(pool, {R});
    copy_in(ref_logits, x);
    crossentropy_forward_backward(ref_losses, ref_logits, targets, V, dloss);  // in place, f32
    std::vector<double> want(R * Vp);
    ref::crossentropy_backward_ref(want.data(), x.data(), tg.data(), R, Vp, V, dloss);
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("R={} Vp={} V={} {}", R, Vp, V, dtype_name(t)));
      Tensor logits = make_tensor(pool, {R, Vp}), losses = make_tensor(pool, {R});
      copy_in(logits, x);
      Tensor dlogits = random_any(pool, {R, Vp}, t, 3);
      crossentropy_forward_backward(losses, dlogits, logits, targets, V, dloss);
      EXPECT_EQ(to_doubles(losses), to_doubles(ref_losses));
      Tensor rounded_ref = make_tensor(pool, {R, Vp}, t);
      convert(rounded_ref, ref_logits);
      EXPECT_EQ(std::memcmp(dlogits.raw_data(), rounded_ref.raw_data(), dlogits.nbytes()), 0);
      // f16's subnormals (below 6.1e-5) carry absolute, not relative, precision.
      const double atol = t == DType::f16 ? 0x1p-25 : 1e-6 * dloss;
      EXPECT_TRUE(all_close(to_doubles_any(dlogits), want, unit_roundoff(t) + 1e-5, atol));
      // In place, rounded to t and kept f32 (the widened LM head's operand): the same gradient
      // widened, bit for bit, padding included.
      Tensor in_place = make_tensor(pool, {R, Vp}), in_place_losses = make_tensor(pool, {R});
      copy_in(in_place, x);
      crossentropy_forward_backward(in_place_losses, in_place, targets, V, dloss, t);
      EXPECT_EQ(to_doubles(in_place_losses), to_doubles(ref_losses));
      Tensor widened = make_tensor(pool, {R, Vp});
      convert(widened, dlogits);
      EXPECT_EQ(std::memcmp(in_place.raw_data(), widened.raw_data(), in_place.nbytes()), 0);
    }
  }
}

TEST(CrossEntropyMixed, DTypeErrors) {
  MemoryPool pool;
  Tensor logits = make_tensor(pool, {4, 16}), losses = make_tensor(pool, {4});
  Tensor targets = make_tensor(pool, {4}, DType::i32);
  Tensor d_i = make_tensor(pool, {4, 16}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { crossentropy_forward_backward(losses, d_i, logits, targets, 16, 1.0f); },
      {"[crossentropy_forward_backward]", "dlogits", "i32"}));
  Tensor logits_bf = make_tensor(pool, {4, 16}, DType::bf16),
         d = make_tensor(pool, {4, 16}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { crossentropy_forward_backward(losses, d, logits_bf, targets, 16, 1.0f); },
      {"[crossentropy_forward_backward]", "logits", "f32", "bf16"}));
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { crossentropy_forward_backward(losses, logits, targets, 16, 1.0f, DType::i8); },
      {"[crossentropy_forward_backward]", "round_to", "i8"}));
  Tensor d_bad = make_tensor(pool, {4, 15}, DType::bf16);
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { crossentropy_forward_backward(losses, d_bad, logits, targets, 16, 1.0f); },
      {"[crossentropy_forward_backward]", "dlogits", "(4, 16)", "(4, 15)"}));
}

TEST(EmbeddingMixed, HalfTablesActAsTheirF32Values) {
  MemoryPool pool;
  const int64_t B = 3, T = 7, C = 37, V = 11, maxT = 9;
  const std::vector<int32_t> tok = random_ids(B * T, 53, static_cast<int32_t>(V));
  Tensor tokens = make_tensor(pool, {B, T}, DType::i32);
  copy_in(tokens, tok);
  for (DType et : {DType::f32, DType::bf16, DType::f16}) {
    for (DType pt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("wte {} wpe {}", dtype_name(et), dtype_name(pt)));
      std::vector<double> e, p;
      Tensor wte = random_any(pool, {V, C}, et, 51, &e),
             wpe = random_any(pool, {maxT, C}, pt, 52, &p);
      Tensor wte32 = make_tensor(pool, {V, C}), wpe32 = make_tensor(pool, {maxT, C});
      copy_in(wte32, e);
      copy_in(wpe32, p);
      Tensor out = make_tensor(pool, {B, T, C}), out32 = make_tensor(pool, {B, T, C});
      embedding_forward(out, tokens, wte, wpe);
      embedding_forward(out32, tokens, wte32, wpe32);
      EXPECT_EQ(to_doubles(out), to_doubles(out32));
      std::vector<double> want(B * T * C);
      ref::embedding_forward_ref(want.data(), tok.data(), e.data(), p.data(), B, T, C);
      EXPECT_TRUE(all_close(to_doubles(out), want, 6e-8, 0));
    }
  }
  Tensor wte = make_tensor(pool, {V, C}, DType::bf16),
         wpe = make_tensor(pool, {maxT, C}, DType::i8);
  Tensor out_bf = make_tensor(pool, {B, T, C}, DType::bf16), out = make_tensor(pool, {B, T, C});
  EXPECT_TRUE(throws_with<DTypeError>([&] { embedding_forward(out, tokens, wte, wpe); },
                                      {"[embedding_forward]", "wpe", "i8"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { embedding_forward(out_bf, tokens, wte, wte); },
                                      {"[embedding_forward]", "out", "f32", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
