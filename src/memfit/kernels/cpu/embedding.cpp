// Token plus position embedding. Forward is a gather of two rows per token. Backward is a
// scatter-add where many rows hit the same wte row; instead of atomics or per-thread copies of
// the table it splits the channels over threads, so each thread owns a column band of dwte and
// dwpe and walks every token in order: no races, and the same sums whatever the thread count.
// Mixed precision: wte and wpe may be the bf16 / f16 working copies, widened as they are read;
// the output (the residual stream) and the whole backward stay f32.
#include "memfit/kernels/cpu/embedding.h"

#include <algorithm>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/half_vec.h"

namespace memfit::kernels {
namespace {

struct Dims {
  int64_t B, T, C;
};

// tokens (B, T) i32, each in [0, V); the table (V, C) and positions (maxT, C) with T <= maxT.
// `e` and `p` name the two tables in messages: wte/wpe, or dwte/dwpe in backward.
// The tables must be f32, or (mixed, already checked to be float types) of their own dtypes.
Dims check_dims(std::string_view op, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                std::string_view e, std::string_view p, bool mixed = false) {
  const Shape& ts = expect_any_shape(tokens, op, "tokens", DType::i32);
  MEMFIT_CHECK_SHAPE(ts.rank() == 2, op, "tokens must be (B, T), got {}", ts);
  const Shape& es = expect_any_shape(wte, op, e, mixed ? wte.dtype() : DType::f32);
  MEMFIT_CHECK_SHAPE(es.rank() == 2, op, "{} must be (V, C), got {}", e, es);
  const Shape& ps = expect_any_shape(wpe, op, p, mixed ? wpe.dtype() : DType::f32);
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
  for (const auto& [t, name] : {std::pair{&wte, "wte"}, std::pair{&wpe, "wpe"}}) {
    MEMFIT_CHECK(t->defined(), op, "{} is undefined", name);
    MEMFIT_CHECK_DTYPE(half::is_float_type(t->dtype()), op,
                       "{} must be f32, bf16 or f16, got {} {}", name, dtype_name(t->dtype()),
                       t->shape());
  }
  const auto [B, T, C] = check_dims(op, tokens, wte, wpe, "wte", "wpe", true);
  expect_tensor(out, op, "out", Shape{B, T, C});
  float* o = out.data<float>();
  const int32_t* tok = tokens.data<int32_t>();
  half::dispatch(wte.dtype(), [&](auto et) {
    half::dispatch(wpe.dtype(), [&](auto pt) {
      constexpr DType E = decltype(et)::value, P = decltype(pt)::value;
      const auto* e = static_cast<const half::Storage<E>*>(wte.raw_data());
      const auto* p = static_cast<const half::Storage<P>*>(wpe.raw_data());
#pragma omp parallel for schedule(static) if (B * T * C > 16384)
      for (int64_t bt = 0; bt < B * T; ++bt) {
        float* orow = o + bt * C;
        const auto* erow = e + static_cast<int64_t>(tok[bt]) * C;
        const auto* prow = p + (bt % T) * C;
        if constexpr (E == DType::f32 && P == DType::f32) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) orow[c] = erow[c] + prow[c];
        } else {
          int64_t c = 0;
#if defined(__AVX512F__)
          for (; c < C; c += 16) {
            const __mmask16 m = vec::tail_mask(C - c);
            _mm512_mask_storeu_ps(orow + c, m,
                                  _mm512_add_ps(half::maskz_load16<E>(m, erow + c),
                                                half::maskz_load16<P>(m, prow + c)));
          }
#endif
          for (; c < C; ++c) orow[c] = half::load1<E>(erow + c) + half::load1<P>(prow + c);
        }
      }
    });
  });
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
