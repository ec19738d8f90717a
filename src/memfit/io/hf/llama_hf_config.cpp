// ModelConfig <-> config.json for the LLaMA family. Field names and defaults follow
// transformers' LlamaConfig (configuration_llama.py) and its rope_init_fn for "llama3".
#include "memfit/io/hf/llama_hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "memfit/core/error.h"
#include "memfit/io/hf/hf_config_common.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A float as the double its shortest decimal spells (1e-5f -> 1e-05, not 9.99999974738e-06), so
// config.json reads as people write it and reads back to the same float.
double as_written(float x) { return std::stod(fmt::format("{}", x)); }

json rope_scaling_json(const kernels::RopeScaling& r) {
  if (!r.enabled()) return nullptr;
  return json{{"factor", as_written(r.factor)},
              {"high_freq_factor", as_written(r.high_freq_factor)},
              {"low_freq_factor", as_written(r.low_freq_factor)},
              {"original_max_position_embeddings", r.original_max_position},
              {"rope_type", "llama3"}};
}

}  // namespace

json llama_config_to_hf_json(const ModelConfig& c, DType dtype) {
  MEMFIT_CHECK(c.family == Family::llama, "config",
               "llama_config_to_hf_json needs a LLaMA config, got {}", family_name(c.family));
  return json{
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"head_dim", c.head_size()},
      {"hidden_act", "silu"},
      {"hidden_size", c.d_model},
      {"initializer_range", 0.02},
      {"intermediate_size", c.ffn_dim},
      {"max_position_embeddings", c.max_seq_len},
      {"mlp_bias", false},
      {"model_type", "llama"},
      {"num_attention_heads", c.n_head},
      {"num_hidden_layers", c.n_layer},
      {"num_key_value_heads", c.n_kv_head},
      {"pretraining_tp", 1},
      {"rms_norm_eps", as_written(c.norm_eps)},
      {"rope_scaling", rope_scaling_json(c.rope_scaling)},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_embeddings},
      {"torch_dtype", std::string(hf_torch_dtype_name(dtype))},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
  };
}

ModelConfig llama_config_from_hf_json(const json& j, std::string_view source) {
  hf_config_check_object(j, source);
  auto fail = [&](const std::string& field, const std::string& what) {
    MEMFIT_THROW(ConfigError, "config", "{}: field '{}' {}", source, field, what);
  };
  auto integer = [&](const json& obj, const char* field, const std::string& shown) {
    return hf_config_int(obj, field, shown, source);
  };
  auto positive = [&](const char* field) { return hf_config_positive(j, field, source); };
  auto number = [&](const json& obj, const std::string& field, const std::string& shown) {
    const json& v = obj[field];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      fail(shown, fmt::format("must be a positive number, got {}", v.dump()));
    return v.get<double>();
  };
  auto require = [&](const char* field, std::initializer_list<json> allowed, const char* why) {
    hf_config_require(j, field, allowed, why, source);
  };

  require("model_type", {"llama"}, "a LLaMA checkpoint");
  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    bool causal_lm = false;
    if (a.is_array())
      for (const json& x : a) causal_lm |= x == "LlamaForCausalLM";
    if (!causal_lm)
      fail("architectures", fmt::format("is {}; memfit reads LlamaForCausalLM (a language-model "
                                        "head over the vocabulary)",
                                        a.dump()));
  }
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = positive("num_hidden_layers");
  c.n_head = positive("num_attention_heads");
  c.d_model = positive("hidden_size");
  c.ffn_dim = positive("intermediate_size");
  c.max_seq_len = positive("max_position_embeddings");
  c.vocab_size = positive("vocab_size");
  c.n_kv_head = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                    ? integer(j, "num_key_value_heads", "num_key_value_heads")
                    : c.n_head;
  require("hidden_act", {"silu"}, "SwiGLU's gate is silu");
  require("attention_bias", {false}, "q/k/v/o projections without biases");
  require("mlp_bias", {false}, "gate/up/down projections without biases");
  if (j.contains("head_dim") && !j["head_dim"].is_null() &&
      j["head_dim"] != c.d_model / c.n_head)
    fail("head_dim", fmt::format("is {}; memfit's heads are hidden_size / num_attention_heads "
                                 "= {} / {} = {} wide",
                                 j["head_dim"].dump(), c.d_model, c.n_head,
                                 c.d_model / c.n_head));
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      fail("tie_word_embeddings", fmt::format("must be true or false, got {}",
                                              j["tie_word_embeddings"].dump()));
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  } else {
    c.tie_embeddings = false;  // LlamaConfig's default
  }
  c.norm_eps = j.contains("rms_norm_eps") ? static_cast<float>(number(j, "rms_norm_eps",
                                                                      "rms_norm_eps"))
                                          : 1e-6f;

  // Rotary: rope_theta and rope_scaling (transformers 4.x) or rope_parameters (5.x), which
  // holds rope_theta and the scaling fields in one object.
  c.rope_theta = j.contains("rope_theta") ? number(j, "rope_theta", "rope_theta") : 10000.0;
  std::string scaling_field = "rope_scaling";
  json scaling = j.contains("rope_scaling") ? j["rope_scaling"] : json(nullptr);
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    scaling_field = "rope_parameters";
    scaling = j["rope_parameters"];
    if (scaling.is_object() && scaling.contains("rope_theta"))
      c.rope_theta = number(scaling, "rope_theta", "rope_parameters.rope_theta");
  }
  if (!scaling.is_null()) {
    if (!scaling.is_object())
      fail(scaling_field, fmt::format("must be an object or null, got {}", scaling.dump()));
    std::string type = "default";
    for (const char* key : {"rope_type", "type"})
      if (scaling.contains(key) && scaling[key].is_string()) type = scaling[key].get<std::string>();
    if (type == "llama3") {
      for (const char* key :
           {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        if (!scaling.contains(key))
          fail(scaling_field, fmt::format("is {}: llama3 scaling needs '{}'", scaling.dump(), key));
      auto sub = [&](const char* key) { return scaling_field + "." + key; };
      c.rope_scaling.factor = static_cast<float>(number(scaling, "factor", sub("factor")));
      c.rope_scaling.low_freq_factor =
          static_cast<float>(number(scaling, "low_freq_factor", sub("low_freq_factor")));
      c.rope_scaling.high_freq_factor =
          static_cast<float>(number(scaling, "high_freq_factor", sub("high_freq_factor")));
      c.rope_scaling.original_max_position =
          integer(scaling, "original_max_position_embeddings",
                  sub("original_max_position_embeddings"));
      if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
        fail(scaling_field, fmt::format("is {}: high_freq_factor must exceed low_freq_factor",
                                        scaling.dump()));
    } else if (type != "default") {
      fail(scaling_field,
           fmt::format("is {}; memfit implements rotary scaling 'llama3' only (or none)",
                       scaling.dump()));
    }
  }
  hf_config_finalize(c, source);
  return c;
}

ModelConfig read_llama_config(const fs::path& path) {
  return llama_config_from_hf_json(hf_config_read_json(path), path.string());
}

}  // namespace memfit::io
