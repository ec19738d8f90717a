#include "memfit/train/train_config.h"

namespace memfit {

ModelConfig TrainConfig::model_config() const {
  ModelConfig c = ModelConfig::preset(model);
  if (n_layer) c.n_layer = n_layer;
  if (n_head) c.n_head = n_head;
  if (d_model) c.d_model = d_model;
  if (seq_len) c.max_seq_len = seq_len;
  if (vocab) c.vocab_size = vocab;
  c.finalize();
  return c;
}

PrecisionOptions TrainConfig::precision_options() const {
  return {precision_from_name(precision), master_weights != "none"};
}

ActivationOptions TrainConfig::activation_options() const {
  ActivationOptions o;
  o.attention = attention_kind_from_name(attention);
  o.ckpt = CheckpointPolicy::parse(ckpt);
  o.precision = precision_from_name(precision);
  return o;
}

}  // namespace memfit
