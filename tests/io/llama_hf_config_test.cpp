// LlamaConfig <-> ModelConfig: round trips, the published TinyLlama and Llama 3.2 configs, the
// refusals that name the file and the field, and the family dispatch of model_hf_config.h.
#include "memfit/io/hf/llama_hf_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/hf/gpt2_hf_config.h"
#include "memfit/io/hf/model_hf_config.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

using nlohmann::json;

// meta-llama/Llama-3.2-1B's config.json.
constexpr const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json (no rope_theta: the default).
constexpr const char* kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.35.0",
  "use_cache": true, "vocab_size": 32000})";

std::string config_error(const json& j) {
  try {
    llama_config_from_hf_json(j, "some/dir/config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << j.dump();
  return "";
}

void expect_contains(const std::string& msg, const std::vector<std::string>& needles) {
  for (const std::string& n : needles)
    EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
}

TEST(LlamaHfConfig, RoundTripsEveryLlamaPresetAndVariant) {
  std::vector<ModelConfig> configs;
  for (const std::string& name : ModelConfig::preset_names()) {
    ModelConfig c = ModelConfig::preset(name);
    if (c.family == Family::llama) configs.push_back(c);
  }
  ModelConfig odd = ModelConfig::preset("llama-tiny");
  odd.vocab_size = 500;  // padded to 512
  odd.tie_embeddings = true;
  odd.norm_eps = 1e-6f;
  odd.rope_theta = 123456.5;
  odd.rope_scaling = {8, 1.5f, 3, 64};
  odd.finalize();
  configs.push_back(odd);
  ASSERT_GE(configs.size(), 5u);
  for (const ModelConfig& c : configs) {
    json j = llama_config_to_hf_json(c, DType::bf16);
    EXPECT_EQ(llama_config_from_hf_json(j, "x"), c) << c.describe();
    EXPECT_EQ(model_config_from_hf_json(json::parse(j.dump()), "x"), c) << c.describe();
  }
}

TEST(LlamaHfConfig, WritesTheFieldsTransformersReads) {
  ModelConfig c = ModelConfig::preset("llama3.2-1b");
  json j = llama_config_to_hf_json(c, DType::bf16);
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_size"], 2048);
  EXPECT_EQ(j["intermediate_size"], 8192);
  EXPECT_EQ(j["num_attention_heads"], 32);
  EXPECT_EQ(j["num_key_value_heads"], 8);
  EXPECT_EQ(j["num_hidden_layers"], 16);
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["max_position_embeddings"], 131072);
  EXPECT_EQ(j["vocab_size"], 128256);
  EXPECT_EQ(j["rms_norm_eps"], 1e-05);  // as written, not 9.99999974738e-06
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_scaling"], json::parse(R"({"factor": 32.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"})"));
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["mlp_bias"], false);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_TRUE(llama_config_to_hf_json(ModelConfig::preset("llama-tiny"))["rope_scaling"].is_null());
  EXPECT_EQ(llama_config_to_hf_json(ModelConfig::preset("llama-tiny"))["torch_dtype"], "float32");
}

TEST(LlamaHfConfig, ReadsThePublishedConfigs) {
  EXPECT_EQ(llama_config_from_hf_json(json::parse(kLlama32), "Llama-3.2-1B/config.json"),
            ModelConfig::preset("llama3.2-1b"));
  EXPECT_EQ(llama_config_from_hf_json(json::parse(kTinyLlama), "TinyLlama/config.json"),
            ModelConfig::preset("tinyllama-1.1b"));
  // transformers 5's rope_parameters holds rope_theta and the scaling in one object.
  json v5 = json::parse(kLlama32);
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0,
      "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192})");
  EXPECT_EQ(llama_config_from_hf_json(v5, "v5"), ModelConfig::preset("llama3.2-1b"));
  // LlamaConfig's defaults for what a minimal file leaves out.
  json minimal = {{"hidden_size", 64}, {"intermediate_size", 128}, {"num_attention_heads", 4},
                  {"num_hidden_layers", 2}, {"vocab_size", 100},
                  {"max_position_embeddings", 32}};
  ModelConfig m = llama_config_from_hf_json(minimal, "min");
  EXPECT_EQ(m.n_kv_head, 4);
  EXPECT_FLOAT_EQ(m.norm_eps, 1e-6f);
  EXPECT_EQ(m.rope_theta, 10000.0);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_FALSE(m.rope_scaling.enabled());
  EXPECT_EQ(m.padded_vocab, 128);
}

TEST(LlamaHfConfig, RefusesWhatChangesTheMathNamingFileAndField) {
  const json base = json::parse(kTinyLlama);
  auto with = [&](const char* field, json value) {
    json j = base;
    j[field] = std::move(value);
    return j;
  };
  expect_contains(config_error(with("hidden_act", "gelu")),
                  {"some/dir/config.json", "'hidden_act'", "\"gelu\"", "silu"});
  expect_contains(config_error(with("attention_bias", true)), {"'attention_bias'"});
  expect_contains(config_error(with("mlp_bias", true)), {"'mlp_bias'"});
  expect_contains(config_error(with("head_dim", 128)),
                  {"'head_dim'", "2048 / 32 = 64"});
  expect_contains(config_error(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}})),
                  {"'rope_scaling'", "llama3"});
  expect_contains(config_error(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}})),
                  {"'rope_scaling'", "needs 'low_freq_factor'"});
  expect_contains(config_error(with("architectures", {"LlamaForSequenceClassification"})),
                  {"'architectures'", "LlamaForCausalLM"});
  expect_contains(config_error(with("model_type", "mistral")), {"'model_type'", "\"mistral\""});
  expect_contains(config_error(with("num_key_value_heads", 5)), {"some/dir/config.json",
                                                                 "n_kv_head 5 must divide"});
  expect_contains(config_error(with("rms_norm_eps", -1)), {"'rms_norm_eps'", "positive"});
  json missing = base;
  missing.erase("hidden_size");
  expect_contains(config_error(missing), {"missing field 'hidden_size'"});
  // Accepted: a null head_dim, a rope_scaling of type default, dropout (memfit has none).
  EXPECT_NO_THROW(llama_config_from_hf_json(with("head_dim", nullptr), "x"));
  EXPECT_NO_THROW(llama_config_from_hf_json(with("rope_scaling", {{"rope_type", "default"}}), "x"));
  EXPECT_NO_THROW(llama_config_from_hf_json(with("attention_dropout", 0.1), "x"));
}

TEST(ModelHfConfig, DispatchesOnArchitecturesAndModelType) {
  ModelConfig gpt2 = ModelConfig::preset("gpt2-tiny");
  json g = gpt2_config_to_hf_json(gpt2);
  EXPECT_EQ(hf_config_family(g, "x"), Family::gpt2);
  EXPECT_EQ(model_config_from_hf_json(g, "x"), gpt2);
  EXPECT_EQ(model_config_to_hf_json(gpt2), g);
  ModelConfig llama = ModelConfig::preset("llama-tiny");
  EXPECT_EQ(model_config_to_hf_json(llama, DType::bf16),
            llama_config_to_hf_json(llama, DType::bf16));
  json l = json::parse(kTinyLlama);
  l.erase("architectures");
  EXPECT_EQ(hf_config_family(l, "x"), Family::llama);  // model_type alone
  l = json::parse(kTinyLlama);
  l.erase("model_type");
  EXPECT_EQ(hf_config_family(l, "x"), Family::llama);  // architectures alone

  auto error = [](const json& j) {
    try {
      hf_config_family(j, "dir/config.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted " << j.dump();
    return std::string();
  };
  expect_contains(error({{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"}}),
                  {"dir/config.json", "'architectures'", "MistralForCausalLM", "LlamaForCausalLM"});
  expect_contains(error({{"model_type", "mistral"}}), {"'model_type'", "\"mistral\""});
  expect_contains(error({{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "llama"}}),
                  {"disagree"});
  expect_contains(error({{"n_embd", 8}}), {"neither 'architectures' nor 'model_type'"});

  testing::ScratchDir root;
  write_file_atomic(root / "config.json", std::string_view(kLlama32));
  EXPECT_EQ(read_model_config(root / "config.json"), ModelConfig::preset("llama3.2-1b"));
  write_file_atomic(root / "bad.json", std::string_view("{"));
  EXPECT_THROW(read_model_config(root / "bad.json"), IoError);
}

}  // namespace
}  // namespace memfit::io
