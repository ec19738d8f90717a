// LoRA adapters (Hu et al. 2021, as PEFT lays them out): the model's base weights stay frozen and
// each targeted linear layer W (out, in) gains y += (alpha / r) (x A^T) B^T with A (r, in) and
// B (out, r). The adapters are a second, small parameter layout: one f32 slab that the
// gradients (and, in a trainer, master weights and optimizer state) are laid out alike with.
// Targets name the roles of both families; on a fused layer (LLaMA's q|k|v and gate|up) an
// adapter covers its member's rows of the output. Note [LoRA] in docs/notes/lora.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/tensor_slices.h"

namespace memfit {

// The frozen base's storage (--base-dtype; Note [NF4 weights], "QLoRA", Note [Int8 weights]):
// `precision`, the run's working weights (bf16 under --precision bf16, f32 under fp32); `bf16`,
// the same asked for by name (needs --precision bf16); `nf4` and `int8`, the blocks' linear
// weights quantized (QLoRA's NF4, or LLM.int8's per-row int8), the embeddings, norms and head as
// the precision says.
enum class LoraBase : uint8_t { precision, bf16, nf4, int8 };
// "bf16", "nf4", "int8"; ConfigError naming --base-dtype for anything else.
LoraBase lora_base_from_name(std::string_view name);
std::string_view lora_base_name(LoraBase base);

struct LoraOptions {
  int rank = 0;        // 0: no LoRA
  float alpha = 16;    // the adapter's output is scaled by alpha / rank
  float dropout = 0;   // on the adapters' input in training, in [0, 1) (lora_dropout.h)
  std::string targets = "all-linear";  // a comma-separated list (lora_target_names)
  LoraBase base = LoraBase::precision;  // --base-dtype
  // The quantized base's format (nf4, int8), or none (a base in the working dtype).
  std::optional<kernels::WeightQuant> base_quant() const {
    if (base == LoraBase::nf4) return kernels::WeightQuant::nf4;
    if (base == LoraBase::int8) return kernels::WeightQuant::int8;
    return std::nullopt;
  }
  bool enabled() const { return rank > 0; }
  float scale() const { return alpha / static_cast<float>(rank); }
};

// PEFT's module names start with the blocks' Hugging Face prefix ("transformer.h",
// "model.layers"): the family's hf_prefix + block_prefix (model/model_family.h).
std::string peft_block_prefix(Family family);

// The target names a family accepts, in the order the layer computes them: LLaMA's q, k, v, o,
// gate, up, down; GPT-2's attn (c_attn), proj (attn.c_proj), fc (c_fc), mlp_proj (mlp.c_proj);
// "all-linear" is every one of them (the LM head is never adapted).
std::vector<std::string> lora_target_names(Family family);
// ConfigError for a rank below 1, a non-positive alpha, a dropout outside [0, 1), an
// empty, unknown or repeated target: the message names the family's targets.
void check_lora_options(const LoraOptions& options, Family family);
// The targets `options` chooses, as names of lora_target_names in the family's order
// ("all-linear" spelled out): two lists that choose the same layers compare equal.
std::vector<std::string> lora_chosen_targets(const LoraOptions& options, Family family);
// PEFT's target_modules (module names, matched as suffixes of the layer's full name as PEFT
// does: "q_proj", "self_attn.q_proj"; GPT-2's bare "c_proj" is both attn.c_proj and mlp.c_proj)
// as a --lora-targets list; "all-linear" when every layer of the family is chosen.
// ConfigError for a module that is none of the family's layers, naming them.
std::string lora_targets_from_modules(const std::vector<std::string>& modules, Family family);

// One adapter: PEFT's module name ("model.layers.0.self_attn.q_proj", "transformer.h.0.attn.
// c_attn"), where it acts, and where A and B lie in the adapter slab.
struct LoraParam {
  std::string module;
  int layer;
  LinearSlot slot;
  int part;          // which adapter of the slot: 0 for a whole layer, q/k/v 0/1/2, gate/up 0/1
  int64_t row0;      // the first output row of the layer it covers
  int64_t out, in;   // B is (out, r), A is (r, in)
  int64_t a_offset, b_offset;  // elements from the slab's start, 64-byte aligned
};

class LoraLayout {
 public:
  LoraLayout(const ModelConfig& config, const LoraOptions& options);
  const LoraOptions& options() const { return options_; }
  const std::vector<LoraParam>& params() const { return params_; }
  int64_t total() const { return total_; }  // slab elements, alignment padding included
  // The adapters as a parameter layout ("<module>.lora_A.weight", "<module>.lora_B.weight",
  // 2-D weights with weight decay), which every optimizer steps as it steps the model's.
  // The optimizers keep a reference to it: it lives as long as this layout.
  const ParamLayout& param_layout() const { return as_params_; }
  // Sets each block's LoRA views in `w` to `slab` (laid out by this layout: the adapters'
  // weights or their gradients). An undefined slab clears them.
  void bind(ModelWeights& w, const Tensor& slab) const;
  // PEFT's initialisation, drawn from `seed`: A kaiming-uniform (a = sqrt(5): uniform in
  // +-1/sqrt(in)), B zero, so the adapted model starts as the base model. `slab` is f32.
  // Under --tp or --pp the whole model's adapters are drawn and tensor rank `rank` takes its
  // slices of its stage's (whole_runs), so every layout starts from one process's values.
  void init(const Tensor& slab, uint64_t seed, int rank = 0) const;

  // Under --tp (a config with tp > 1; Note [LoRA], "Under --tp"): a column-parallel layer's
  // (q|k|v, fc, gate|up) B is split by rows as its weight and A is whole on every rank; a
  // row-parallel layer's (attention out, MLP proj/down) A is split by columns as its weight
  // and B is whole. Under --pp a stage holds its own blocks' adapters (Note [LoRA], "Under
  // --pp"). The whole adapters' layout: this config at tp 1 and every stage (whole_run_model).
  LoraLayout whole() const;
  // Where tensor rank `rank`'s slab elements lie in the whole adapters' slab (whole()), runs in
  // increasing local order; the alignment gaps are in no run. A stage's whole matrices are one
  // run each, at the whole slab's offsets of its blocks.
  std::vector<SliceRun> whole_runs(int rank) const;
  // The slab ranges of the matrices every tensor rank holds whole (column-parallel A,
  // row-parallel B): their gradients are each rank's share (d(A) of a column-parallel layer
  // sums over its rank's output rows; d(B) of a row-parallel one over its input columns), so
  // they are summed over the tensor group once a step. Empty at tp 1.
  std::vector<ElementRange> replicated_ranges() const;

 private:
  ModelConfig config_;
  LoraOptions options_;
  std::vector<LoraParam> params_;
  int64_t total_ = 0;
  ParamLayout as_params_{{}, 0};
};

}  // namespace memfit
