// Dispatch on a config.json's family. See model_hf_config.h.
#include "memfit/io/hf/model_hf_config.h"

#include <fmt/format.h>

#include <optional>
#include <string>

#include "memfit/core/error.h"
#include "memfit/io/hf/gpt2_hf_config.h"
#include "memfit/io/hf/hf_config_common.h"
#include "memfit/io/hf/llama_hf_config.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kKnown =
    "memfit reads GPT2LMHeadModel (model_type gpt2) and LlamaForCausalLM (model_type llama)";

}  // namespace

Family hf_config_family(const json& j, std::string_view source) {
  hf_config_check_object(j, source);
  std::optional<Family> by_arch, by_type;
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const json& a = j["architectures"];
    if (!a.is_array())
      MEMFIT_THROW(ConfigError, "config", "{}: field 'architectures' must be a list, got {}",
                   source, a.dump());
    for (const json& x : a) {
      if (x == "GPT2LMHeadModel") by_arch = Family::gpt2;
      if (x == "LlamaForCausalLM") by_arch = Family::llama;
    }
    if (!by_arch && !a.empty())
      MEMFIT_THROW(ConfigError, "config", "{}: field 'architectures' is {}; {}", source, a.dump(),
                   kKnown);
  }
  if (j.contains("model_type")) {
    const json& t = j["model_type"];
    if (t == "gpt2") by_type = Family::gpt2;
    else if (t == "llama") by_type = Family::llama;
    else
      MEMFIT_THROW(ConfigError, "config", "{}: field 'model_type' is {}; {}", source, t.dump(),
                   kKnown);
  }
  if (by_arch && by_type && *by_arch != *by_type)
    MEMFIT_THROW(ConfigError, "config", "{}: 'architectures' {} and 'model_type' {} disagree",
                 source, j["architectures"].dump(), j["model_type"].dump());
  if (by_arch) return *by_arch;
  if (by_type) return *by_type;
  MEMFIT_THROW(ConfigError, "config",
               "{}: neither 'architectures' nor 'model_type' says which model this is; {}",
               source, kKnown);
}

ModelConfig model_config_from_hf_json(const json& j, std::string_view source) {
  const Family family = hf_config_family(j, source);
  switch (family) {
    case Family::gpt2: return gpt2_config_from_hf_json(j, source);
    case Family::llama: return llama_config_from_hf_json(j, source);
  }
  MEMFIT_THROW(ConfigError, "config", "{}: no config.json reader for the {} family", source,
               family_name(family));
}

ModelConfig read_model_config(const fs::path& path) {
  return model_config_from_hf_json(hf_config_read_json(path), path.string());
}

json model_config_to_hf_json(const ModelConfig& config, DType dtype) {
  switch (config.family) {
    case Family::gpt2: return gpt2_config_to_hf_json(config, dtype);
    case Family::llama: return llama_config_to_hf_json(config, dtype);
  }
  MEMFIT_THROW(ConfigError, "config", "no config.json writer for the {} family",
               family_name(config.family));
}

}  // namespace memfit::io
