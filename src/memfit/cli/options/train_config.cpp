#include "memfit/cli/options/train_config.h"

#include "memfit/core/error.h"
#include "memfit/model/model_family.h"

namespace memfit {

ModelConfig TrainConfig::model_config() const {
  ModelConfig c = ModelConfig::preset(model_name());
  if (n_layer) c.n_layer = n_layer;
  if (n_head) c.n_head = n_head;
  if (d_model) c.d_model = d_model;
  if (seq_len) c.max_seq_len = seq_len;
  if (vocab) c.vocab_size = vocab;
  // GPT-2's shape has no such knobs; say so rather than ignore them.
  auto llama_only = [&](bool set, const char* option) {
    const ModelFamily& family = model_family(c.family);
    if (set && !family.shape_options)
      MEMFIT_THROW(ConfigError, "config", "{} applies to the LLaMA family; --model {} is {}",
                   option, model_name(), family.display_name);
  };
  llama_only(n_kv_head != 0, "--n-kv-head");
  llama_only(ffn_dim != 0, "--ffn-dim");
  llama_only(rope_theta != 0, "--rope-theta");
  llama_only(!tie_embeddings.empty(), "--tie-embeddings");
  if (n_kv_head) c.n_kv_head = n_kv_head;
  if (n_head && !n_kv_head && c.n_head % c.n_kv_head != 0) c.n_kv_head = n_head;
  if (ffn_dim) c.ffn_dim = ffn_dim;
  if (rope_theta) c.rope_theta = rope_theta;
  if (!tie_embeddings.empty()) {
    if (tie_embeddings != "true" && tie_embeddings != "false")
      MEMFIT_THROW(ConfigError, "config", "--tie-embeddings must be true or false, got '{}'",
                   tie_embeddings);
    c.tie_embeddings = tie_embeddings == "true";
  }
  c.finalize();
  return c;
}

PrecisionOptions TrainConfig::precision_options() const {
  return {precision_from_name(precision), master_weights != "none"};
}

}  // namespace memfit
