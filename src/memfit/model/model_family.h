// What differs between model families outside their block code, asked of the family: one table
// per family (model/gpt2/gpt2_family.cpp, model/llama/llama_family.cpp) behind model_family(),
// a switch over Family in model/; what the step runs (the block, the final norm) is the other
// table, model/family_compute.h, kept apart so that what reads configs (the parsers, the fuzz
// harnesses' small library) links no kernels. Code elsewhere asks the table, or, where model/ must
// not know the answer (Hugging Face's names in io/, the planner's rates in plan/), switches over
// Family itself with no default; -Werror=switch then makes a new family fail to compile until
// every such place handles it. Note [Model families] in docs/notes/model-families.md.
#pragma once

#include <string>
#include <string_view>

#include "memfit/model/model_config.h"

namespace memfit {


struct ModelFamily {
  Family id;
  std::string_view name;          // "gpt2": config files, checkpoints, logs, the plan's JSON
  std::string_view display_name;  // "GPT-2": what memfit prints
  // Matrices of ffn_dim rows in the MLP's first matmul: 1 (GPT-2's c_fc), 2 (LLaMA's gate|up).
  int fc_matrices;
  // Rotary positions (a cos/sin table every block reads, which needs an even head size) rather
  // than a learned position embedding.
  bool rotary;
  // Whether --n-kv-head, --ffn-dim, --rope-theta and --tie-embeddings apply: GPT-2's shape has
  // no such knobs (fix_shape sets them).
  bool shape_options;
  const char* final_norm_tag;  // the final norm's output: "ln_f", "norm"
  // Names. Block l's weights are "<block_prefix>.<l>.<rest>" in the layout ("h",
  // "model.layers"); Hugging Face's names are hf_prefix + the layout's ("transformer." for
  // GPT2LMHeadModel; LLaMA's layout uses Hugging Face's names as they are), so PEFT's module
  // names start hf_prefix + block_prefix; hf_transposed: its linear weights are stored (in, out)
  // (GPT-2's Conv1D; PEFT's fan_in_fan_out).
  std::string_view block_prefix;
  std::string_view hf_prefix;
  bool hf_transposed;

  // The fields the family fixes, before ModelConfig::finalize's shared checks and defaults.
  void (*fix_shape)(ModelConfig& c);
  // ModelConfig::describe(): "12 layers, 12 heads, width 768, ...".
  std::string (*describe)(const ModelConfig& c);
  // The initial weights of the residual projections (attention out, MLP out) are normal(0,
  // 0.02) times this: GPT-2's 1 / sqrt(2 n_layer), 1 for LLaMA.
  double (*residual_init_scale)(const ModelConfig& c);

};

const ModelFamily& model_family(Family family);

}  // namespace memfit
