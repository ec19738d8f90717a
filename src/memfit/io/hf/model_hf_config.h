// config.json of any family memfit reads: one reader that looks at `architectures` and
// `model_type` and hands the file to the family's reader (gpt2_hf_config.h, llama_hf_config.h),
// and one writer that picks the family's from ModelConfig::family. Checkpoint loading, the
// trainer's --init-from / --resume and `memfit sample` go through these, never a family's own.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/model/model_config.h"

namespace memfit::io {

// The family a config.json describes: architectures GPT2LMHeadModel or model_type gpt2 ->
// gpt2; LlamaForCausalLM or llama -> llama. Both absent, another model, or the two fields
// disagreeing: ConfigError naming `source` and the field.
Family hf_config_family(const nlohmann::json& json, std::string_view source);
// The family's reader applied to the object (see hf_config_family).
ModelConfig model_config_from_hf_json(const nlohmann::json& json, std::string_view source);
// Reads a config.json file: IoError if unreadable or not JSON, else as above.
ModelConfig read_model_config(const std::filesystem::path& config_json);
// The family's Hugging Face config; `dtype` (the stored weights' type) becomes torch_dtype.
nlohmann::json model_config_to_hf_json(const ModelConfig& config, DType dtype = DType::f32);

}  // namespace memfit::io
