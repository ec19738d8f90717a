// Token plus position embedding. Forward is a gather of two rows per token. Backward is a
// scatter-add where many rows hit the same wte row; instead of atomics or per-thread copies of
// the table it splits the channels over threads, so each thread owns a column band of dwte and
// dwpe and walks every token in order: no races, and the same sums whatever the thread count.
// Mixed precision: wte and wpe may be the bf16 / f16 working copies, widened as they are read;
// the output (the residual stream) and the whole backward stay f32.
// Forward and backward are one source for every SIMD target (simd.h), dispatched at run time;
// the public functions are at the end.
#include "memfit/kernels/cpu/embedding.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/embedding.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

template <DType E, DType P>
void forward_rows(float* o, const int32_t* tok, const half::Storage<E>* e,
                  const half::Storage<P>* p, int64_t bt0, int64_t bt1, int64_t T, int64_t C) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t bt = bt0; bt < bt1; ++bt) {
    float* orow = o + bt * C;
    const auto* erow = e + static_cast<int64_t>(tok[bt]) * C;
    int64_t c = 0;
    if (p == nullptr) {  // no position table (LLaMA: rotary positions)
      for (; c + N <= C; c += N) hn::StoreU(load<E>(d, erow + c), d, orow + c);
      for (; c < C; ++c) orow[c] = half::load1<E>(erow + c);
      continue;
    }
    const auto* prow = p + (bt % T) * C;
    for (; c + N <= C; c += N) hn::StoreU(hn::Add(load<E>(d, erow + c), load<P>(d, prow + c)), d, orow + c);
    for (; c < C; ++c) orow[c] = half::load1<E>(erow + c) + half::load1<P>(prow + c);
  }
}

// Rows [bt0, bt1) of out = wte[token] + wpe[position], the tables widened as they are read.
void EmbeddingForwardRows(DType et, DType pt, float* o, const int32_t* tok, const void* e, const void* p,
                 int64_t bt0, int64_t bt1, int64_t T, int64_t C) {
  half::dispatch(et, [&](auto etag) {
    half::dispatch(pt, [&](auto ptag) {
      constexpr DType E = decltype(etag)::value, P = decltype(ptag)::value;
      forward_rows<E, P>(o, tok, static_cast<const half::Storage<E>*>(e),
                         static_cast<const half::Storage<P>*>(p), bt0, bt1, T, C);
    });
  });
}

// Columns [c0, c1) of dwte[token] += dout and dwpe[position] += dout (dp null: no position
// table), tokens in order: one add per element, so every target gives the same bits.
void EmbeddingBackwardBand(float* de, float* dp, const float* dy, const int32_t* tok, int64_t BT,
                           int64_t T, int64_t C, int64_t c0, int64_t c1) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t bt = 0; bt < BT; ++bt) {
    const float* g = dy + bt * C;
    float* erow = de + static_cast<int64_t>(tok[bt]) * C;
    float* prow = dp == nullptr ? nullptr : dp + (bt % T) * C;
    int64_t c = c0;
    for (; c + N <= c1; c += N) {
      const auto gv = hn::LoadU(d, g + c);
      hn::StoreU(hn::Add(hn::LoadU(d, erow + c), gv), d, erow + c);
      if (prow != nullptr) hn::StoreU(hn::Add(hn::LoadU(d, prow + c), gv), d, prow + c);
    }
    for (; c < c1; ++c) {
      erow[c] += g[c];
      if (prow != nullptr) prow[c] += g[c];
    }
  }
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(EmbeddingForwardRows);
HWY_EXPORT(EmbeddingBackwardBand);

namespace {

// Read into named locals, not a structured binding: clang cannot capture one in an OpenMP
// region.
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
  if (wpe.defined()) {
    const Shape& ps = expect_any_shape(wpe, op, p, mixed ? wpe.dtype() : DType::f32);
    MEMFIT_CHECK_SHAPE(ps.rank() == 2 && ps[1] == es[1] && ps[0] >= ts[1], op,
                       "{} must be (maxT, C) with maxT >= T: {} {}, {} {}, tokens {}", p, p, ps, e,
                       es, ts);
  }
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
  KernelScope timed("embedding_forward");
  constexpr std::string_view op = "embedding_forward";
  for (const auto& [t, name] : {std::pair{&wte, "wte"}, std::pair{&wpe, "wpe"}}) {
    if (t == &wpe && !wpe.defined()) continue;  // token embedding only
    MEMFIT_CHECK(t->defined(), op, "{} is undefined", name);
    MEMFIT_CHECK_DTYPE(half::is_float_type(t->dtype()), op,
                       "{} must be f32, bf16 or f16, got {} {}", name, dtype_name(t->dtype()),
                       t->shape());
  }
  const auto dims = check_dims(op, tokens, wte, wpe, "wte", "wpe", true);
  const int64_t B = dims.B, T = dims.T, C = dims.C;
  expect_tensor(out, op, "out", Shape{B, T, C});
  float* o = out.data<float>();
  const int32_t* tok = tokens.data<int32_t>();
  const DType et = wte.dtype(), pt = wpe.defined() ? wpe.dtype() : et;
  const void *e = wte.raw_data(), *p = wpe.defined() ? wpe.raw_data() : nullptr;
#pragma omp parallel if (B * T * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(EmbeddingForwardRows)(et, pt, o, tok, e, p, B * T * tid / nth,
                                      B * T * (tid + 1) / nth, T, C);
  }
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  KernelScope timed("embedding_backward");
  constexpr std::string_view op = "embedding_backward";
  const auto dims = check_dims(op, tokens, dwte, dwpe, "dwte", "dwpe");
  const int64_t B = dims.B, T = dims.T, C = dims.C;
  expect_tensor(dout, op, "dout", Shape{B, T, C});
  float *de = dwte.data<float>(), *dp = dwpe.defined() ? dwpe.data<float>() : nullptr;
  const float* dy = dout.data<float>();
  const int32_t* tok = tokens.data<int32_t>();
  // Column bands of 64 floats (four cache lines): enough bands to share out, long enough runs.
  constexpr int64_t kBand = 64;
  const int64_t bands = (C + kBand - 1) / kBand;
#pragma omp parallel for schedule(static) if (B * T * C > kParallelGrain)
  for (int64_t band = 0; band < bands; ++band) {
    const int64_t c0 = band * kBand, c1 = std::min(C, c0 + kBand);
    MEMFIT_SIMD_DISPATCH(EmbeddingBackwardBand)(de, dp, dy, tok, B * T, T, C, c0, c1);
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
