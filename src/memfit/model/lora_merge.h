// A LoRA model folded into plain weights: each adapted layer's weight W (out, in) becomes
// W + (alpha / r) B A, as PEFT's merge_and_unload computes it, so a merged model computes what
// the adapted one did up to the rounding of the merge (f32: one rounding per weight; a bf16
// weight is widened, added to and rounded once). What `memfit export --merge-lora` writes one
// tensor at a time and what `memfit sample` of a LoRA save runs. Note [LoRA] in
// docs/notes/lora.md.
#pragma once

#include "memfit/memory/tensor.h"
#include "memfit/model/lora.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// Adds (alpha / r) B A of every adapter of `layout` that acts on the model's parameter `p` (a
// ParamInfo of the model's ParamLayout for `config`) into `w` (p's shape, f32 or bf16).
// `adapters` is the f32 adapter slab laid out by `layout`. Returns the number of adapters
// merged into it (0: p is not adapted, w untouched).
int lora_merge_param(const ModelConfig& config, const LoraLayout& layout, const Tensor& adapters,
                     const ParamInfo& p, const Tensor& w);

// Every adapted parameter of `params` (a slab laid out by `param_layout`) merged in place.
// Returns the adapters merged (layout.params().size() when every one found its layer).
int lora_merge(const ModelConfig& config, const ParamLayout& param_layout, const Tensor& params,
               const LoraLayout& layout, const Tensor& adapters);

}  // namespace memfit
