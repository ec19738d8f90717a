// Hugging Face's LlamaConfig (config.json) written from and read into memfit's ModelConfig, so a
// saved LLaMA directory loads with transformers.LlamaForCausalLM.from_pretrained and a
// downloaded TinyLlama / Llama 2 / Llama 3 directory tells memfit its shape. Like
// gpt2_hf_config.h, reading refuses whatever would change the math memfit computes.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/model/model_config.h"

namespace memfit::io {

// The LlamaConfig of a LLaMA-family memfit config; `dtype` (the weights' element type) becomes
// torch_dtype. hidden_act silu, no biases, head_dim = hidden_size / num_attention_heads,
// rope_scaling null or {"rope_type": "llama3", ...}, bos/eos null (memfit's config does not know
// the tokenizer).
nlohmann::json llama_config_to_hf_json(const ModelConfig& config, DType dtype = DType::f32);
// A LLaMA-family config from a LlamaConfig JSON object. Needs hidden_size, intermediate_size,
// num_attention_heads, num_hidden_layers, vocab_size and max_position_embeddings; the rest take
// transformers' defaults (num_key_value_heads = num_attention_heads, rms_norm_eps 1e-6,
// rope_theta 10000, tie_word_embeddings false). Also reads transformers v5's rope_parameters.
// Refuses, as ConfigError naming `source` (the file) and the field: hidden_act other than silu,
// attention_bias or mlp_bias true, head_dim other than hidden_size / num_attention_heads,
// rope_scaling other than none or llama3, architectures without LlamaForCausalLM.
ModelConfig llama_config_from_hf_json(const nlohmann::json& json, std::string_view source);
// Reads and parses a config.json file: IoError if unreadable or not JSON, else as above.
ModelConfig read_llama_config(const std::filesystem::path& config_json);

}  // namespace memfit::io
