// A model's shape: its family (GPT-2 or LLaMA), layers, heads, width, context and vocabulary,
// and the family's constants (norm epsilon, rotary frequencies), with the named presets. One
// struct for every family, so the skeleton, the planner and the search read one type; a field a
// family does not use keeps its default and is checked to (finalize()).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/kernels/cpu/rope.h"
#include "memfit/model/pipeline_stages.h"

namespace memfit {

// What differs between the families is asked of the family (model/model_family.h) or decided
// by an exhaustive switch over this enum (no default, built with -Werror=switch): a new family
// fails to compile until every place handles it. No `family == Family::gpt2 ? a : b`.
enum class Family : uint8_t {
  gpt2,   // LayerNorm with biases, learned positions, GELU MLP, biased linears, tied head
  llama,  // RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases
};
std::string_view family_name(Family family);  // "gpt2", "llama": files, logs, the plan's JSON

struct ModelConfig {
  Family family = Family::gpt2;
  int n_layer = 2;
  int n_head = 4;
  int n_kv_head = 0;        // key/value heads (LLaMA's grouped-query attention); 0: n_head
  int d_model = 96;
  int ffn_dim = 0;          // the MLP's hidden width; 0: the family's default (GPT-2: 4 d_model)
  int max_seq_len = 64;     // n_positions / max_position_embeddings
  int vocab_size = 512;     // real tokens
  int padded_vocab = 512;   // rows of the embedding and head: vocab_size rounded up to 64
  bool tie_embeddings = true;  // the LM head is the token embedding (GPT-2 always)
  float norm_eps = 1e-5f;
  double rope_theta = 10000;   // LLaMA only
  kernels::RopeScaling rope_scaling;  // Llama 3's frequency scaling (rope_scaling in config.json)
  // Tensor parallelism (--tp; Note [Tensor parallel] in docs/notes/tensor-parallel.md): the
  // ranks each block's matrices, the embedding and the LM head are split over. The fields above
  // stay the whole model's; the widths below (heads, q|k|v, attention, MLP, vocabulary rows) are
  // one rank's, which is what the parameter layout, the step and the planner read. 1: whole.
  int tp = 1;
  // Pipeline parallelism (--pp; Note [Pipeline parallel] in docs/notes/pipeline-parallel.md):
  // the stage of the model this rank holds, blocks [stage.first, stage.last), the embeddings
  // on the first stage and the final norm and LM head on the last. The fields above stay the
  // whole model's; the parameter layout (the stage's parameters alone), the step and the
  // planner read the stage. One stage of one (the default): the whole model.
  PipelineStage stage;
  bool pipelined() const { return stage.stages > 1; }
  // Makes this the model of stage `s` (after finalize(); stages of one: the whole model again).
  // ConfigError naming --pp for a stage that does not cut n_layer blocks (a tied model's last
  // stage holds a copy of the token table: Note [Pipeline parallel], "Tied embeddings").
  void set_pipeline_stage(const PipelineStage& s);

  int head_size() const { return d_model / n_head; }
  // This rank's query and key/value heads, MLP width and vocabulary rows (embedding and head:
  // the vocabulary padded to tp * 64, divided by tp; padded_vocab at tp 1).
  // Where tp exceeds n_kv_head (a multiple of it), each rank holds one key/value head, the one
  // its query heads use, replicated on kv_replicas() neighbouring ranks (Note [Tensor parallel],
  // "Grouped-query attention").
  int local_heads() const { return n_head / tp; }
  int local_kv_heads() const { return n_kv_head >= tp ? n_kv_head / tp : 1; }
  int kv_replicas() const { return n_kv_head >= tp ? 1 : tp / n_kv_head; }
  int local_ffn() const { return ffn_dim / tp; }
  int64_t local_vocab() const;
  // Width of the fused q|k|v projection output: (n_head + 2 n_kv_head) head_size (this rank's
  // heads under tp).
  int64_t qkv_width() const { return int64_t{local_heads() + 2 * local_kv_heads()} * head_size(); }
  // Width of the attention output: n_head head_size (d_model in every preset; this rank's
  // heads under tp).
  int64_t attn_width() const { return int64_t{local_heads()} * head_size(); }
  // Width of the MLP's first matmul output: GPT-2's c_fc (ffn_dim), LLaMA's gate|up (2 ffn_dim);
  // this rank's under tp.
  int64_t fc_width() const;
  // Splits the model over `T` tensor-parallel ranks (after finalize()): ConfigError naming --tp
  // unless T divides the heads and the MLP width, and divides or is a multiple of the key/value
  // heads.
  void set_tensor_parallel(int T);
  // Weights of one block's four matmuls (qkv, attention out, fc, MLP out): 12 C^2 for GPT-2
  // (one rank's under tp).
  int64_t block_matmul_params() const {
    return int64_t{d_model} * (qkv_width() + attn_width() + fc_width() + local_ffn());
  }
  // Checks the fields, resolves the defaults (n_kv_head, ffn_dim) and sets padded_vocab; throws
  // ConfigError naming the field at fault.
  void finalize();
  int64_t num_params() const;  // elements in the parameter slab (padding rows included)
  std::string describe() const;
  bool operator==(const ModelConfig&) const = default;

  static ModelConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();
};

inline constexpr int kVocabPadMultiple = 64;

}  // namespace memfit
