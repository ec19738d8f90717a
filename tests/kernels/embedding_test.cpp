// Embedding: the double reference against finite differences, the fast kernel against the
// reference (repeated tokens, accumulation into nonzero gradients), and typed errors.
#include "memfit/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include "memfit/kernels/ref/embedding_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

TEST(EmbeddingRef, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, C = 5, V = 4, maxT = 4;
  const std::vector<int32_t> tok = {1, 3, 1, 0, 1, 2};  // repeats: gradients must add
  std::vector<double> wte = random_values(V * C, 1), wpe = random_values(maxT * C, 2),
                      wout = random_values(B * T * C, 3);
  std::vector<double> out(B * T * C);
  auto loss = [&] {
    ref::embedding_forward_ref(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, wout);
  };
  std::vector<double> dwte(V * C, 0.0), dwpe(maxT * C, 0.0);
  ref::embedding_backward_ref(dwte.data(), dwpe.data(), wout.data(), tok.data(), B, T, C);
  EXPECT_TRUE(all_close(dwte, numeric_grad(loss, wte), 1e-6, 1e-9));
  EXPECT_TRUE(all_close(dwpe, numeric_grad(loss, wpe), 1e-6, 1e-9));
}

struct EmbCase {
  int64_t B, T, C, V, maxT;
};

class EmbeddingFast : public ::testing::TestWithParam<EmbCase> {};

TEST_P(EmbeddingFast, MatchesReference) {
  const auto [B, T, C, V, maxT] = GetParam();
  MemoryPool pool;
  std::vector<double> e, p, dy, de0, dp0;
  Tensor wte = random_tensor(pool, {V, C}, 51, &e), wpe = random_tensor(pool, {maxT, C}, 52, &p);
  const std::vector<int32_t> tok = random_ids(B * T, 53, static_cast<int32_t>(V));
  Tensor tokens = make_tensor(pool, {B, T}, DType::i32);
  copy_in(tokens, tok);
  Tensor out = make_tensor(pool, {B, T, C});
  embedding_forward(out, tokens, wte, wpe);
  std::vector<double> want(B * T * C);
  ref::embedding_forward_ref(want.data(), tok.data(), e.data(), p.data(), B, T, C);
  EXPECT_TRUE(all_close(to_doubles(out), want, 6e-8, 0)) << "forward";

  Tensor dout = random_tensor(pool, {B, T, C}, 54, &dy);
  Tensor dwte = random_tensor(pool, {V, C}, 55, &de0),
         dwpe = random_tensor(pool, {maxT, C}, 56, &dp0);
  embedding_backward(dwte, dwpe, dout, tokens);
  std::vector<double> de = de0, dp = dp0;
  ref::embedding_backward_ref(de.data(), dp.data(), dy.data(), tok.data(), B, T, C);
  // Float sums of up to B*T terms: error grows with the count, so scale by the largest value.
  EXPECT_TRUE(all_close(to_doubles(dwte), de, 1e-6, 1e-6 * max_abs(de))) << "dwte";
  EXPECT_TRUE(all_close(to_doubles(dwpe), dp, 1e-6, 1e-6 * max_abs(dp))) << "dwpe";
}

// LLaMA: no position table. The forward is the token rows, the backward the same dwte as with
// one (the position gradient is a separate sum), bit for bit.
TEST_P(EmbeddingFast, WithoutPositionsIsTheTokenRows) {
  const auto [B, T, C, V, maxT] = GetParam();
  MemoryPool pool;
  std::vector<double> e, p, dy, de0, dp0;
  Tensor wte = random_tensor(pool, {V, C}, 61, &e), wpe = random_tensor(pool, {maxT, C}, 62, &p);
  Tensor zeros = make_tensor(pool, {maxT, C}), none;
  const std::vector<int32_t> tok = random_ids(B * T, 63, static_cast<int32_t>(V));
  Tensor tokens = make_tensor(pool, {B, T}, DType::i32);
  copy_in(tokens, tok);
  Tensor out = make_tensor(pool, {B, T, C}), with_zeros = make_tensor(pool, {B, T, C});
  embedding_forward(out, tokens, wte, none);
  embedding_forward(with_zeros, tokens, wte, zeros);
  EXPECT_EQ(to_doubles(out), to_doubles(with_zeros));
  Tensor dout = random_tensor(pool, {B, T, C}, 64, &dy);
  Tensor da = random_tensor(pool, {V, C}, 65, &de0), db = random_tensor(pool, {V, C}, 65, &de0);
  Tensor dwpe = random_tensor(pool, {maxT, C}, 66, &dp0);
  embedding_backward(da, none, dout, tokens);
  embedding_backward(db, dwpe, dout, tokens);
  EXPECT_EQ(to_doubles(da), to_doubles(db));
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingFast,
                         ::testing::Values(EmbCase{1, 1, 1, 1, 1}, EmbCase{2, 3, 5, 7, 4},
                                           EmbCase{3, 17, 33, 11, 20}, EmbCase{4, 64, 768, 50, 64},
                                           EmbCase{2, 100, 130, 1000, 128}));

TEST(Embedding, TokensOutsideTheTableAreErrors) {
  MemoryPool pool;
  Tensor wte = make_tensor(pool, {10, 4}), wpe = make_tensor(pool, {8, 4}),
         out = make_tensor(pool, {1, 3, 4}), tokens = make_tensor(pool, {1, 3}, DType::i32);
  copy_in(tokens, std::vector<int32_t>{0, 10, 2});
  EXPECT_TRUE(throws_with<Error>([&] { embedding_forward(out, tokens, wte, wpe); },
                                 {"[embedding_forward]", "token 10", "[0, 10)"}));
  copy_in(tokens, std::vector<int32_t>{0, -3, 2});
  EXPECT_TRUE(throws_with<Error>([&] { embedding_backward(wte, wpe, out, tokens); },
                                 {"[embedding_backward]", "token -3"}));
}

TEST(Embedding, ShapeAndDTypeErrors) {
  MemoryPool pool;
  Tensor wte = make_tensor(pool, {10, 4}), wpe_short = make_tensor(pool, {2, 4}),
         wpe = make_tensor(pool, {8, 4}), out = make_tensor(pool, {1, 3, 4}),
         tokens = make_tensor(pool, {1, 3}, DType::i32);
  EXPECT_TRUE(throws_with<ShapeError>([&] { embedding_forward(out, tokens, wte, wpe_short); },
                                      {"[embedding_forward]", "wpe", "(2, 4)", "(1, 3)"}));
  Tensor out_bad = make_tensor(pool, {1, 3, 5});
  EXPECT_TRUE(throws_with<ShapeError>([&] { embedding_forward(out_bad, tokens, wte, wpe); },
                                      {"[embedding_forward]", "out", "(1, 3, 4)", "(1, 3, 5)"}));
  Tensor dwpe_bad = make_tensor(pool, {8, 5});
  EXPECT_TRUE(throws_with<ShapeError>([&] { embedding_backward(wte, dwpe_bad, out, tokens); },
                                      {"[embedding_backward]", "dwpe", "(8, 5)"}));
  Tensor tokens_f32 = make_tensor(pool, {1, 3});
  EXPECT_TRUE(throws_with<DTypeError>([&] { embedding_forward(out, tokens_f32, wte, wpe); },
                                      {"[embedding_forward]", "tokens", "i32", "f32"}));
}

}  // namespace
}  // namespace memfit::kernels
