// ModelConfig <-> config.json. Field names and defaults follow transformers' ModelConfig.
#include "memfit/io/hf/gpt2_hf_config.h"

#include <cmath>

#include "memfit/core/error.h"
#include "memfit/io/hf/hf_config_common.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kGpt2EndOfText = 50256;  // <|endoftext|>, GPT-2's bos and eos
constexpr double kLayerNormEps = 1e-5;

}  // namespace

json gpt2_config_to_hf_json(const ModelConfig& c, DType dtype) {
  const bool gpt2_vocab = c.vocab_size > kGpt2EndOfText;
  return json{
      {"activation_function", "gelu_new"},
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"attn_pdrop", 0.0},
      {"bos_token_id", gpt2_vocab ? json(kGpt2EndOfText) : json(nullptr)},
      {"embd_pdrop", 0.0},
      {"eos_token_id", gpt2_vocab ? json(kGpt2EndOfText) : json(nullptr)},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", kLayerNormEps},
      {"model_type", "gpt2"},
      {"n_ctx", c.max_seq_len},
      {"n_embd", c.d_model},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"n_layer", c.n_layer},
      {"n_positions", c.max_seq_len},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", 0.0},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"summary_activation", nullptr},
      {"summary_first_dropout", 0.1},
      {"summary_proj_to_labels", true},
      {"summary_type", "cls_index"},
      {"summary_use_proj", true},
      {"tie_word_embeddings", true},
      {"torch_dtype", std::string(hf_torch_dtype_name(dtype))},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
  };
}

ModelConfig gpt2_config_from_hf_json(const json& j, std::string_view source) {
  hf_config_check_object(j, source);
  auto positive = [&](const char* field) { return hf_config_positive(j, field, source); };
  auto require = [&](const char* field, std::initializer_list<json> allowed, const char* why) {
    hf_config_require(j, field, allowed, why, source);
  };

  require("model_type", {"gpt2"}, "a GPT-2 checkpoint");
  ModelConfig c;
  c.n_layer = positive("n_layer");
  c.n_head = positive("n_head");
  c.d_model = positive("n_embd");
  c.max_seq_len = positive("n_positions");
  c.vocab_size = positive("vocab_size");
  require("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "the tanh GELU");
  require("n_inner", {nullptr, 4 * c.d_model}, "an MLP 4 n_embd wide");
  require("tie_word_embeddings", {true}, "the LM head is tied to wte");
  require("scale_attn_weights", {true}, "attention scaled by 1/sqrt(head size)");
  require("scale_attn_by_inverse_layer_idx", {false}, "no per-layer attention scaling");
  if (j.contains("layer_norm_epsilon")) {
    const json& v = j["layer_norm_epsilon"];
    if (!v.is_number() || std::abs(v.get<double>() - kLayerNormEps) > 1e-12)
      MEMFIT_THROW(ConfigError, "config",
                   "{}: field 'layer_norm_epsilon' is {}; memfit's LayerNorm uses 1e-05", source,
                   v.dump());
  }
  hf_config_finalize(c, source);
  return c;
}

ModelConfig read_gpt2_config(const fs::path& path) {
  return gpt2_config_from_hf_json(hf_config_read_json(path), path.string());
}

}  // namespace memfit::io
