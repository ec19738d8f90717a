// LoRA adapters in PEFT's format, which PEFT's PeftModel.from_pretrained loads: a directory with
// adapter_model.safetensors (f32 "base_model.model.<module>.lora_A.weight" (r, in) and
// ".lora_B.weight" (out, r), <module> as Hugging Face names the layer) and adapter_config.json
// (peft_type LORA, r, lora_alpha, lora_dropout, target_modules, fan_in_fan_out for GPT-2's
// Conv1D layers). Note [LoRA] in docs/notes/lora.md.
#pragma once

#include <filesystem>

#include "memfit/memory/tensor.h"
#include "memfit/model/lora.h"

namespace memfit::io {

inline constexpr const char* kAdapterModelFile = "adapter_model.safetensors";
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
// memfit's own: the optimizer's state over the adapters (optimizer.safetensors' format), which
// --resume reads; not PEFT's, and apart from optimizer.safetensors, which would be the base's.
inline constexpr const char* kAdapterOptimizerFile = "adapter_optimizer.safetensors";

// PEFT's name of an adapter parameter: "base_model.model." + the layout's name.
std::string peft_adapter_name(const std::string& adapter_param);

// Writes the adapters of `slab` (f32, laid out by `layout`) into `dir` (created if missing),
// each file atomically.
void save_lora_adapter(const std::filesystem::path& dir, const ModelConfig& model,
                       const LoraLayout& layout, const Tensor& slab);
// Reads `dir`'s adapters into `slab`. IoError for a missing file or tensor, or a config whose
// r, lora_alpha or target_modules differ from `layout`'s (naming both).
void load_lora_adapter(const std::filesystem::path& dir, const ModelConfig& model,
                       const LoraLayout& layout, const Tensor& slab);

// ConfigError when `dir` holds LoRA adapters (adapter_config.json): `command` (sample, export)
// reads the base weights alone, and applying or merging the adapters is not built yet, so it
// refuses rather than silently use the base model.
void refuse_lora_checkpoint(const std::filesystem::path& dir, const char* command);

}  // namespace memfit::io
