// The pieces every family's config.json reader and writer share (gpt2_hf_config.cpp,
// llama_hf_config.cpp, model_hf_config.cpp): reading the file, the checks on one field, and the
// torch_dtype spelling, so the families word their errors alike and fix them in one place.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/model/model_config.h"

namespace memfit::io {

// torch_dtype's name for the stored weights' type: bfloat16, float16, else float32.
std::string_view hf_torch_dtype_name(DType dtype);
// Reads and parses a config.json file: IoError if unreadable or not JSON.
nlohmann::json hf_config_read_json(const std::filesystem::path& config_json);
// ConfigError "`source`: expected a JSON object, got <type>" unless `json` is an object.
void hf_config_check_object(const nlohmann::json& json, std::string_view source);
// obj[field] (which must exist) as an integer in [1, 2^30]; otherwise ConfigError naming
// `source` and the field as `shown` (a dotted path for nested fields).
int hf_config_int(const nlohmann::json& obj, const char* field, std::string_view shown,
                  std::string_view source);
// A required top-level positive integer: ConfigError if missing, else as hf_config_int.
int hf_config_positive(const nlohmann::json& json, const char* field, std::string_view source);
// A field that, if present, must hold one of the values memfit computes with; `why` says what
// those values mean. ConfigError naming `source`, the field and the allowed values otherwise.
void hf_config_require(const nlohmann::json& json, const char* field,
                       std::initializer_list<nlohmann::json> allowed, const char* why,
                       std::string_view source);
// config.finalize(), with its ConfigError prefixed by `source`.
void hf_config_finalize(ModelConfig& config, std::string_view source);

}  // namespace memfit::io
