// The vocabulary-parallel embedding: plain loops (one pass over B x T x C each way, beside the
// blocks' GEMMs). The tables are the working weights (f32, bf16 or f16: rows widened exactly,
// as the whole kernel widens them); the output and the gradients are f32.
#include "memfit/model/vocab_parallel_embedding.h"

#include <algorithm>
#include <span>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/memory/tensor.h"

namespace memfit {

namespace {

void check_f32(const Tensor& t, const char* name) {
  MEMFIT_CHECK_DTYPE(t.dtype() == DType::f32 && t.is_contiguous(), "vocab_parallel_embedding",
                     "{} must be contiguous f32 under --tp, got {} {}", name,
                     dtype_name(t.dtype()), t.shape());
}

// A table of the working weights' type: f32, bf16 or f16, contiguous.
void check_table(const Tensor& t, const char* name) {
  const DType d = t.dtype();
  MEMFIT_CHECK_DTYPE((d == DType::f32 || d == DType::bf16 || d == DType::f16) && t.is_contiguous(),
                     "vocab_parallel_embedding",
                     "{} must be contiguous f32, bf16 or f16 under --tp, got {} {}", name,
                     dtype_name(d), t.shape());
}

}  // namespace

void vocab_parallel_embedding_forward(TensorGroup& group, Tensor& out, const Tensor& tokens,
                                      const Tensor& wte, int64_t begin, const Tensor& wpe,
                                      const Tensor* whole) {
  check_f32(out, "out");
  check_table(wte, "wte");
  const Tensor& lookup = whole ? *whole : out;  // every row's share from this rank
  if (whole) check_f32(*whole, "whole");
  const int64_t C = out.size(-1), N = tokens.numel(), T = tokens.size(-1), rows = wte.size(0);
  MEMFIT_CHECK_SHAPE(lookup.numel() == N * C && wte.size(1) == C &&
                         out.numel() * (whole ? group.size() : 1) == N * C,
                     "vocab_parallel_embedding", "out {} (whole {}) for tokens {} and wte {}",
                     out.shape(), whole ? whole->shape() : Shape{}, tokens.shape(), wte.shape());
  const int32_t* tok = tokens.data<int32_t>();
  const DType et = wte.dtype();
  const size_t es = dtype_size(et);
  const auto* e = static_cast<const std::byte*>(wte.raw_data());
  float* o = lookup.data<float>();
#pragma omp parallel for schedule(static) if (N * C > (1 << 16))
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = int64_t{tok[i]} - begin;
    float* orow = o + i * C;
    if (r >= 0 && r < rows)
      kernels::convert_n(et, DType::f32, orow, e + static_cast<size_t>(r * C) * es, C);
    else
      std::fill_n(orow, C, 0.0f);
  }
  // The rows this rank keeps: all of them, or under --sp its share from row0.
  const int64_t n = whole ? N / group.size() : N, row0 = whole ? group.rank() * n : 0;
  if (whole)
    group.reduce_scatter_sum({o, static_cast<size_t>(N * C)},
                             {out.data<float>(), static_cast<size_t>(n * C)});
  else
    group.all_reduce_sum({o, static_cast<size_t>(N * C)});
  if (!wpe.defined()) return;
  check_table(wpe, "wpe");
  const DType pt = wpe.dtype();
  const size_t ps = dtype_size(pt);
  const auto* p = static_cast<const std::byte*>(wpe.raw_data());
  float* mine = out.data<float>();
  // Each position's row widened once into a row of the output's own (exact), then added.
#pragma omp parallel for schedule(static) if (n * C > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    float* orow = mine + i * C;
    const std::byte* prow = p + static_cast<size_t>(((row0 + i) % T) * C) * ps;
    if (pt == DType::f32) {
      const float* pf = reinterpret_cast<const float*>(prow);
      for (int64_t c = 0; c < C; ++c) orow[c] += pf[c];
      continue;
    }
    const auto* ph = reinterpret_cast<const uint16_t*>(prow);
    for (int64_t c = 0; c < C; ++c)
      orow[c] += pt == DType::bf16 ? f32_from_bf16(ph[c]) : f32_from_f16(ph[c]);
  }
}

void vocab_parallel_embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout,
                                       const Tensor& tokens, int64_t begin) {
  check_f32(dwte, "dwte");
  check_f32(dout, "dout");
  const int64_t C = dout.size(-1), N = tokens.numel(), T = tokens.size(-1), rows = dwte.size(0);
  const int32_t* tok = tokens.data<int32_t>();
  const float* g = dout.data<float>();
  float* de = dwte.data<float>();
  float* dp = nullptr;
  if (dwpe.defined()) {
    check_f32(dwpe, "dwpe");
    dp = dwpe.data<float>();
  }
  // Column bands over the threads, every token in order within a band (the kernel's order).
#pragma omp parallel for schedule(static) if (N * C > (1 << 16))
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    const int64_t c1 = std::min(C, c0 + 16);
    for (int64_t i = 0; i < N; ++i) {
      const float* grow = g + i * C;
      const int64_t r = int64_t{tok[i]} - begin;
      if (r >= 0 && r < rows)
        for (int64_t c = c0; c < c1; ++c) de[r * C + c] += grow[c];
      if (dp != nullptr)
        for (int64_t c = c0; c < c1; ++c) dp[(i % T) * C + c] += grow[c];
    }
  }
}

}  // namespace memfit
