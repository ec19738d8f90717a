// Token plus position embedding. Forward is a gather of two rows per token. Backward is a
// scatter-add where many rows hit the same wte row; instead of atomics or per-thread copies of
// the table it splits the channels over threads, so each thread owns a column band of dwte and
// dwpe and walks every token in order: no races, and the same sums whatever the thread count.
// f32 only for now: a bf16 path needs only a dtype branch and a widening row add.
#include "memfit/kernels/cpu/embedding.h"

#include <algorithm>

#include "memfit/kernels/cpu/checks.h"

namespace memfit::kernels {
namespace {

struct Dims {
  int64_t B, T, C;
};

// tokens (B, T) i32, each in [0, V); the table (V, C) and positions (maxT, C) with T <= maxT.
// `e` and `p` name the two tables in messages: wte/wpe, or dwte/dwpe in backward.
Dims check_dims(std::string_view op, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                std::string_view e, std::string_view p) {
  const Shape& ts = expect_any_shape(tokens, op, "tokens", DType::i32);
  MEMFIT_CHECK_SHAPE(ts.rank() == 2, op, "tokens must be (B, T), got {}", ts);
  const Shape& es = expect_any_shape(wte, op, e);
  MEMFIT_CHECK_SHAPE(es.rank() == 2, op, "{} must be (V, C), got {}", e, es);
  const Shape& ps = expect_any_shape(wpe, op, p);
  MEMFIT_CHECK_SHAPE(ps.rank() == 2 && ps[1] == es[1] && ps[0] >= ts[1], op,
                     "{} must be (maxT, C) with maxT >= T: {} {}, {} {}, tokens {}", p, p, ps, e,
                     es, ts);
  const int32_t* tok = tokens.data<int32_t>();
  const int64_t V = es[0];
  for (int64_t i = 0; i < ts.numel(); ++i) {
    MEMFIT_CHECK(tok[i] >= 0 && tok[i] < V, op, "token {} at position {} is outside [0, {})",
                 tok[i], i, V);
  }
  return {ts[0], ts[1], es[1]};
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  constexpr std::string_view op = "embedding_forward";
  const auto [B, T, C] = check_dims(op, tokens, wte, wpe, "wte", "wpe");
  expect_tensor(out, op, "out", Shape{B, T, C});
  float* o = out.data<float>();
  const int32_t* tok = tokens.data<int32_t>();
  const float *e = wte.data<float>(), *p = wpe.data<float>();
#pragma omp parallel for schedule(static) if (B * T * C > 16384)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    float* orow = o + bt * C;
    const float* erow = e + static_cast<int64_t>(tok[bt]) * C;
    const float* prow = p + (bt % T) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) orow[c] = erow[c] + prow[c];
  }
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  constexpr std::string_view op = "embedding_backward";
  const auto [B, T, C] = check_dims(op, tokens, dwte, dwpe, "dwte", "dwpe");
  expect_tensor(dout, op, "dout", Shape{B, T, C});
  float *de = dwte.data<float>(), *dp = dwpe.data<float>();
  const float* dy = dout.data<float>();
  const int32_t* tok = tokens.data<int32_t>();
  // Column bands of 64 floats (four cache lines): enough bands to share out, long enough runs.
  constexpr int64_t kBand = 64;
  const int64_t bands = (C + kBand - 1) / kBand;
#pragma omp parallel for schedule(static) if (B * T * C > 16384)
  for (int64_t band = 0; band < bands; ++band) {
    const int64_t c0 = band * kBand, c1 = std::min(C, c0 + kBand);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* g = dy + bt * C;
      float* erow = de + static_cast<int64_t>(tok[bt]) * C;
      float* prow = dp + (bt % T) * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        erow[c] += g[c];
        prow[c] += g[c];
      }
    }
  }
}

}  // namespace memfit::kernels
