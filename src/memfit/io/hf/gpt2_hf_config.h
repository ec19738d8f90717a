// Hugging Face's ModelConfig (config.json) written from and read into memfit's ModelConfig, so a
// saved directory loads with transformers.GPT2LMHeadModel.from_pretrained and a downloaded GPT-2
// directory tells memfit its shape. Only fields that change the math are checked on reading.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/model/model_config.h"

namespace memfit::io {

// The Hugging Face ModelConfig of a memfit config; `dtype` (the weights' element type) becomes
// torch_dtype. Dropouts are 0 (memfit has none), activation gelu_new, eps 1e-5, tied embeddings.
nlohmann::json gpt2_config_to_hf_json(const ModelConfig& config, DType dtype = DType::f32);
// A memfit config from a ModelConfig JSON object. Needs n_layer, n_head, n_embd, n_positions and
// vocab_size; refuses fields that would change the math memfit computes (another activation,
// layer_norm_epsilon other than 1e-5, untied embeddings, n_inner other than 4 n_embd, ...).
// Throws ConfigError naming `source` (the file) and the field.
ModelConfig gpt2_config_from_hf_json(const nlohmann::json& json, std::string_view source);
// Reads and parses a config.json file: IoError if unreadable or not JSON, else as above.
ModelConfig read_gpt2_config(const std::filesystem::path& config_json);

}  // namespace memfit::io
