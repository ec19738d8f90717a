#include "memfit/model/lora_merge.h"

#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/model/model_family.h"

namespace memfit {

namespace {

// The adapter's module name ("transformer.h.0.attn.c_attn", "model.layers.0.mlp.up_proj") of a
// model parameter's weight, or "" for one that is not a weight.
std::string module_of(const ModelConfig& config, const ParamInfo& p) {
  constexpr std::string_view kWeight = ".weight";
  if (p.name.size() <= kWeight.size() ||
      p.name.compare(p.name.size() - kWeight.size(), kWeight.size(), kWeight) != 0)
    return "";
  const std::string stem = p.name.substr(0, p.name.size() - kWeight.size());
  // GPT-2's names in the layout leave out Hugging Face's "transformer." (param_layout.h).
  return std::string(model_family(config.family).hf_prefix) + stem;
}

}  // namespace

int lora_merge_param(const ModelConfig& config, const LoraLayout& layout, const Tensor& adapters,
                     const ParamInfo& p, const Tensor& w) {
  MEMFIT_CHECK_SHAPE(adapters.numel() == layout.total() && adapters.dtype() == DType::f32,
                     "lora_merge", "an adapter slab of {} f32 elements, got {} {}",
                     layout.total(), adapters.numel(), dtype_name(adapters.dtype()));
  const std::string module = module_of(config, p);
  if (module.empty() || p.layer < 0) return 0;
  const int64_t r = layout.options().rank;
  const float scale = layout.options().scale();
  int merged = 0;
  for (const LoraParam& a : layout.params()) {
    if (a.layer != p.layer || a.module != module) continue;
    MEMFIT_CHECK_SHAPE(p.shape.rank() == 2 && p.shape[0] == a.out && p.shape[1] == a.in &&
                           w.numel() == p.numel,
                       "lora_merge", "{}: the weight is {} ({} elements given), the adapter ({}, {})",
                       p.name, p.shape, w.numel(), a.out, a.in);
    MEMFIT_CHECK_DTYPE(w.dtype() == DType::f32 || w.dtype() == DType::bf16, "lora_merge",
                       "{}: weights must be f32 or bf16, got {}", p.name, dtype_name(w.dtype()));
    const float* A = adapters.data<float>() + a.a_offset;  // (r, in)
    const float* B = adapters.data<float>() + a.b_offset;  // (out, r)
    const int64_t in = a.in;
    std::vector<float> delta(static_cast<size_t>(in));
    for (int64_t i = 0; i < a.out; ++i) {
      // Row i of B A, as PEFT's (B @ A) * scaling: the sum over r first, then the scale.
      std::fill(delta.begin(), delta.end(), 0.0f);
      for (int64_t k = 0; k < r; ++k) {
        const float b = B[i * r + k];
        const float* a_row = A + k * in;
        for (int64_t j = 0; j < in; ++j) delta[static_cast<size_t>(j)] += b * a_row[j];
      }
      if (w.dtype() == DType::f32) {
        float* row = w.data<float>() + i * in;
        for (int64_t j = 0; j < in; ++j) row[j] += delta[static_cast<size_t>(j)] * scale;
      } else {
        uint16_t* row = static_cast<uint16_t*>(w.raw_data()) + i * in;
        for (int64_t j = 0; j < in; ++j)
          row[j] = bf16_from_f32(f32_from_bf16(row[j]) + delta[static_cast<size_t>(j)] * scale);
      }
    }
    ++merged;
  }
  return merged;
}

int lora_merge(const ModelConfig& config, const ParamLayout& param_layout, const Tensor& params,
               const LoraLayout& layout, const Tensor& adapters) {
  int merged = 0;
  for (const ParamInfo& p : param_layout.params())
    merged += lora_merge_param(config, layout, adapters, p, params.view(p.offset, p.shape));
  return merged;
}

}  // namespace memfit
