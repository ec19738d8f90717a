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
// Whether `dir` holds LoRA adapters (an adapter_config.json).
bool has_lora_adapter(const std::filesystem::path& dir);
// The options `dir`'s adapter_config.json was made with, for a model of `model`'s family: r,
// lora_alpha, and target_modules as --lora-targets names (PEFT's suffix matching, so another
// tool's ["q_proj", "v_proj"] reads as q,v). lora_dropout is a training setting and is not
// read (dropout stays 0). IoError for a missing or malformed config and for what memfit does
// not build (use_rslora, use_dora, rank_pattern, alpha_pattern, layers_to_transform, a bias,
// a regular expression as target_modules), naming the field.
LoraOptions read_lora_options(const std::filesystem::path& dir, const ModelConfig& model);
// Reads `dir`'s adapters into `slab`. IoError for a missing file or tensor, or a config whose
// r, lora_alpha or targets differ from `layout`'s (naming the field and both values).
void load_lora_adapter(const std::filesystem::path& dir, const ModelConfig& model,
                       const LoraLayout& layout, const Tensor& slab);

// ConfigError when `dir` holds LoRA adapters: memfit export without --merge-lora would write
// the base weights alone, so it refuses rather than silently export the base model.
void refuse_lora_checkpoint(const std::filesystem::path& dir, const char* command);

}  // namespace memfit::io
