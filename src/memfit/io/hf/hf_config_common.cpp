// Shared config.json helpers. See hf_config_common.h.
#include "memfit/io/hf/hf_config_common.h"

#include <cstdint>
#include <string>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::string_view hf_torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      return "float32";
  }
}

json hf_config_read_json(const fs::path& path) {
  std::string text = read_file_to_string(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "config", "{}: not valid JSON: {}", path.string(), e.what());
  }
}

void hf_config_check_object(const json& j, std::string_view source) {
  if (!j.is_object())
    MEMFIT_THROW(ConfigError, "config", "{}: expected a JSON object, got {}", source,
                 j.type_name());
}

int hf_config_int(const json& obj, const char* field, std::string_view shown,
                  std::string_view source) {
  const json& v = obj[field];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30))
    MEMFIT_THROW(ConfigError, "config", "{}: field '{}' must be a positive integer, got {}",
                 source, shown, v.dump());
  return v.get<int>();
}

int hf_config_positive(const json& j, const char* field, std::string_view source) {
  if (!j.contains(field))
    MEMFIT_THROW(ConfigError, "config", "{}: missing field '{}'", source, field);
  return hf_config_int(j, field, field, source);
}

void hf_config_require(const json& j, const char* field, std::initializer_list<json> allowed,
                       const char* why, std::string_view source) {
  if (!j.contains(field)) return;
  for (const json& a : allowed)
    if (j[field] == a) return;
  MEMFIT_THROW(ConfigError, "config", "{}: field '{}' is {}; memfit supports only {} ({})", source,
               field, j[field].dump(), json(allowed).dump(), why);
}

void hf_config_finalize(ModelConfig& c, std::string_view source) {
  try {
    c.finalize();
  } catch (const ConfigError& e) {
    MEMFIT_THROW(ConfigError, "config", "{}: {}", source, e.detail());
  }
}

}  // namespace memfit::io
