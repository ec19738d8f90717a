// Stored FP8 weights over a shard of master weights (fp8_shard.h; Note [FP8], "Storage", "Over
// ranks").
#include "memfit/model/fp8_shard.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/fp8.h"

namespace memfit {

namespace {

// Matrix m's elements inside `range` (possibly empty).
ElementRange part_of(const Fp8Matrix& m, ElementRange range) {
  return range.intersect({m.layout_offset, m.layout_offset + m.rows * m.cols});
}

Tensor master_part(const Tensor& master, int64_t master_begin, ElementRange part) {
  MEMFIT_CHECK(part.begin >= master_begin && part.end <= master_begin + master.numel(),
               "fp8_weights", "the part [{}, {}) outside the master weights [{}, {})", part.begin,
               part.end, master_begin, master_begin + master.numel());
  return master.view(part.begin - master_begin, {part.size()});
}

}  // namespace

std::vector<float> fp8_weights_amax(const Fp8WeightLayout& layout, const Tensor& master,
                                    int64_t master_begin, ElementRange range) {
  std::vector<float> amax(layout.matrices().size(), 0.0f);
  for (const Fp8Matrix& m : layout.matrices()) {
    const ElementRange part = part_of(m, range);
    if (!part.empty())
      amax[m.index] = kernels::fp8_amax_via_bf16(master_part(master, master_begin, part));
  }
  return amax;
}

float fp8_amax_combine(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::nanf("");
  return std::max(a, b);
}

void fp8_amax_agree(TensorGroup& group, std::span<float> amax) {
  const size_t ranks = static_cast<size_t>(group.size()), n = amax.size();
  if (ranks == 1 || n == 0) return;
  std::vector<float> all(ranks * n);
  group.all_gather(amax, all);
  for (size_t i = 0; i < n; ++i) {
    float a = all[i];
    for (size_t q = 1; q < ranks; ++q) a = fp8_amax_combine(a, all[q * n + i]);
    amax[i] = a;
  }
}

void fp8_weights_set_scales(const Fp8WeightLayout& layout, std::span<const float> amax,
                            const Tensor& buffer) {
  MEMFIT_CHECK(amax.size() == layout.matrices().size(), "fp8_weights",
               "{} amaxes for {} matrices", amax.size(), layout.matrices().size());
  float* scales = layout.scales(buffer).data<float>();
  for (size_t i = 0; i < amax.size(); ++i)
    scales[i] = kernels::fp8_scale_pow2(amax[i], kernels::Fp8Format::e4m3);
}

void fp8_weights_encode_part(const Fp8WeightLayout& layout, const Tensor& master,
                             int64_t master_begin, ElementRange range, const Tensor& buffer) {
  const float* scales = layout.scales(buffer).data<float>();
  for (const Fp8Matrix& m : layout.matrices()) {
    const ElementRange part = part_of(m, range);
    if (part.empty()) continue;
    Tensor codes = buffer.view_bytes(m.at + static_cast<size_t>(part.begin - m.layout_offset),
                                     {part.size()}, DType::u8);
    kernels::fp8_quantize_via_bf16(master_part(master, master_begin, part), scales[m.index],
                                   kernels::Fp8Format::e4m3, codes);
  }
}

void fp8_round_compact(const ParamLayout& layout, const std::vector<int64_t>& compact,
                       const Tensor& slab, const Tensor& master, int64_t master_begin,
                       ElementRange range) {
  const auto& ps = layout.params();
  MEMFIT_CHECK(compact.size() == ps.size(), "fp8_weights", "{} compact offsets for {} parameters",
               compact.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const ElementRange part = range.intersect({ps[i].offset, ps[i].offset + ps[i].numel});
    if (compact[i] < 0 || part.empty()) continue;
    Tensor working = slab.view(compact[i] + part.begin - ps[i].offset, {part.size()});
    kernels::convert(working, master_part(master, master_begin, part));
  }
}

void fp8_weights_fill(const ParamLayout& layout, const std::vector<int64_t>& compact,
                      const Tensor& slab, const Fp8WeightLayout& fp8, const Tensor& buffer,
                      const std::function<void(int64_t, int64_t, float*)>& fill,
                      const Tensor& piece, const Fp8AmaxAgree& agree) {
  const int64_t n = piece.numel();
  MEMFIT_CHECK(n > 0 && piece.dtype() == DType::f32, "fp8_weights", "a set-up piece of {} {}",
               n, dtype_name(piece.dtype()));
  float* at = piece.data<float>();
  const auto& ps = layout.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (compact[i] < 0) continue;
    for (int64_t a = 0; a < ps[i].numel; a += n) {
      const int64_t b = std::min(ps[i].numel, a + n);
      fill(ps[i].offset + a, ps[i].offset + b, at);
      fp8_round_compact(layout, compact, slab, piece.view(0, {b - a}), ps[i].offset + a,
                        {ps[i].offset + a, ps[i].offset + b});
    }
  }
  std::vector<float> amax(fp8.matrices().size(), 0.0f);
  for (const Fp8Matrix& m : fp8.matrices())
    for (int64_t a = 0; a < m.rows * m.cols; a += n) {
      const int64_t b = std::min(m.rows * m.cols, a + n);
      fill(m.layout_offset + a, m.layout_offset + b, at);
      amax[m.index] =
          fp8_amax_combine(amax[m.index], kernels::fp8_amax_via_bf16(piece.view(0, {b - a})));
    }
  if (agree) agree(amax);
  fp8_weights_set_scales(fp8, amax, buffer);
  for (const Fp8Matrix& m : fp8.matrices())
    for (int64_t a = 0; a < m.rows * m.cols; a += n) {
      const int64_t b = std::min(m.rows * m.cols, a + n);
      fill(m.layout_offset + a, m.layout_offset + b, at);
      fp8_weights_encode_part(fp8, piece.view(0, {b - a}), m.layout_offset + a,
                              {m.layout_offset + a, m.layout_offset + b}, buffer);
    }
}

}  // namespace memfit
