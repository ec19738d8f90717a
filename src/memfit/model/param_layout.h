// Where each named parameter lives in the one parameter slab. The same layout indexes the
// gradient slab and every optimizer state slab, and names tensors in checkpoints.
// Layer-major order (embeddings, block 0, block 1, ..., final norm, head) keeps each block's
// parameters contiguous, so ZeRO-3 or offload can gather or move one block as one range
// (docs/notes/model-state.md). Each family lays out its own names; the skeleton reads every
// family's through the same typed views (BlockWeights), never by name.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/shape.h"
#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/memory/tensor.h"
#include "memfit/core/element_range.h"
#include "memfit/model/pipeline_stages.h"

namespace memfit {

struct ModelConfig;

// What a parameter is for; initialisation, checkpoints and optimizers that partition by
// structure (Adam-mini) read this.
enum class ParamRole : uint8_t {
  token_embedding,     // wte / embed_tokens (Vp, C); the LM head too when tied
  position_embedding,  // wpe (maxT, C), GPT-2
  norm_weight,         // LayerNorm or RMSNorm gain (C)
  norm_bias,           // LayerNorm bias (C)
  attn_qkv_weight,     // GPT-2 (3C, C): rows [0,C) query, [C,2C) key, [2C,3C) value
  attn_q_weight,       // LLaMA q_proj (NH hs, C)
  attn_k_weight,       // LLaMA k_proj (KV hs, C)
  attn_v_weight,       // LLaMA v_proj (KV hs, C)
  attn_proj_weight,    // c_proj / o_proj (C, NH hs)
  mlp_fc_weight,       // GPT-2 c_fc (4C, C)
  mlp_gate_weight,     // LLaMA gate_proj (F, C)
  mlp_up_weight,       // LLaMA up_proj (F, C)
  mlp_proj_weight,     // GPT-2 mlp.c_proj (C, 4C) / LLaMA down_proj (C, F)
  linear_bias,         // any linear layer's bias
  lm_head,             // an untied LM head (Vp, C)
};

// A linear layer's weight matrix in a block (attention's q, k, v or fused q|k|v and its output
// projection; the MLP's matrices): what QLoRA stores in NF4 (or int8) and APOLLO and GaLore
// project.
bool is_linear_weight(ParamRole role);

struct ParamInfo {
  // GPT-2: Hugging Face's name without "transformer." ("h.0.attn.c_attn.weight"); LLaMA:
  // Hugging Face's name ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight").
  std::string name;
  Shape shape;       // memfit's layout; linear weights are (out, in) as torch.nn.Linear
  int64_t offset;    // elements from the slab's start; a multiple of 16 (64-byte aligned)
                     // except inside a fused group (q|k|v, gate|up), which is contiguous
  int64_t numel;
  int layer;         // block index, or -1 for embeddings, the final norm and the head
  ParamRole role;
  bool decay;        // weight decay applies: 2-D weights yes, biases and norm gains no
};

// One block's parameters (or gradients: any slab laid out alike) as views. Both families fill
// the same slots: norm1 is ln_1 / input_layernorm; qkv is c_attn / q|k|v_proj (adjacent in
// the slab, so one (qkv_width, C) matrix); attn_out is attn.c_proj / o_proj; norm2 is ln_2 /
// post_attention_layernorm; fc is c_fc / gate|up_proj (one (2F, C) matrix); mlp_out is
// mlp.c_proj / down_proj. A bias the family lacks is an undefined tensor.
// A LoRA adapter on rows [row0, row0 + b.size(0)) of a linear layer's output (a whole layer,
// or one member of a fused group: q, k or v of qkv, gate or up of fc): a (r, in), b (out, r),
// and the layer computes y += scale (x a^T) b^T (model/lora.h; Note [LoRA] in
// docs/notes/lora.md). In gradient views a and b are the adapter's gradients.
struct LoraView {
  Tensor a, b;
  int64_t row0 = 0;
  float scale = 0;
};
// The blocks' four linear layers, in the order BlockWeights lists them.
enum class LinearSlot : uint8_t { qkv, attn_out, fc, mlp_out };
inline constexpr int kLinearSlots = 4;
inline constexpr int kLoraParts = 3;  // adapters on one layer at most: q, k, v
using LoraSet = std::array<LoraView, kLoraParts>;  // undefined a: no adapter in that part

// --precision fp8's stored working weight of one linear layer (model/fp8_weights.h; Note [FP8],
// "Storage"): its E4M3 codes, u8 (out, in), and its scale, an f32 tensor of one value (the codes
// stand for code / scale). Undefined codes: not stored so.
struct Fp8Weight {
  Tensor codes, scale;
};

struct BlockWeights {
  Tensor norm1_w, norm1_b, qkv_w, qkv_b, attn_out_w, attn_out_b;
  Tensor norm2_w, norm2_b, fc_w, fc_b, mlp_out_w, mlp_out_b;
  // LoRA adapters per linear layer (all undefined without --lora-rank).
  std::array<LoraSet, kLinearSlots> lora;
  // A quantized frozen base (--base-dtype nf4 or int8; model/quant_base.h): the four linear
  // weights quantized, in LinearSlot order, where qkv_w .. mlp_out_w are then undefined
  // (undefined: not quantized).
  std::array<kernels::QuantWeight, kLinearSlots> quant{};
  // --precision fp8 with stored weights: the four linear weights as E4M3, in LinearSlot order,
  // where qkv_w .. mlp_out_w are then undefined.
  std::array<Fp8Weight, kLinearSlots> fp8{};
};
struct ModelWeights {
  Tensor tok_emb, pos_emb;  // pos_emb: GPT-2 only
  std::vector<BlockWeights> blocks;
  Tensor norm_w, norm_b;    // the final norm (norm_b: GPT-2 only)
  Tensor head;              // the LM head's (Vp, C) weight: tok_emb when tied
};

class ParamLayout {
 public:
  // The model's parameters; for a pipeline stage (config.pipelined(), Note [Pipeline parallel])
  // the stage's alone: its blocks, the embeddings on the first stage, the final norm and an
  // untied head (or a copy of a tied table, last: model/stage_offsets.h) on the last, with the
  // whole layout's names, shapes and order, at offsets from the stage's first parameter. The
  // stage's parameters but that copy are a contiguous run of the whole layout from
  // whole_offset(), alignment included, so a stage reads the whole model's initial weights or
  // files at its offsets shifted by whole_offset() (the copy: whole_index). Views keep the whole
  // model's block indices (others' undefined); unit_ranges gives the stage's units.
  explicit ParamLayout(const ModelConfig& config);
  // A layout of the given parameters alone (LoRA's adapters, LoraLayout::param_layout): what
  // optimizers and checkpoints read (params(), total()); it has no typed views.
  ParamLayout(std::vector<ParamInfo> params, int64_t total)
      : params_(std::move(params)), total_(total) {}
  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }  // slab elements, alignment padding included
  // Where element 0 lies in the whole model's layout: a pipeline stage's first parameter's
  // offset there; 0 for the whole model.
  int64_t whole_offset() const { return whole_offset_; }
  const ParamInfo& find(const std::string& name) const;  // throws if absent
  // The named parameter as a view into a slab laid out by this layout.
  Tensor view(const Tensor& slab, const ParamInfo& p) const;
  Tensor view(const Tensor& slab, const std::string& name) const { return view(slab, find(name)); }
  // Every parameter of a slab laid out by this layout, as typed views. An undefined slab gives
  // undefined views (the planner runs the step without weights).
  ModelWeights views(const Tensor& slab) const;
  // The views of a compact slab that holds every parameter but the blocks' linear weights,
  // each at compact_offsets()[i] (a quantized base, whose linears are NF4 or int8:
  // Transformer): the linear weights' views are left undefined.
  ModelWeights views_without_linears(const Tensor& compact) const;
  // Per parameter (in params() order): its offset in such a compact slab (64-byte aligned,
  // in layout order), or -1 for a block linear weight; and the compact slab's elements.
  std::vector<int64_t> compact_offsets(int64_t* total = nullptr) const;
  // Rebinds the views of the parameters in `range` (a unit of unit_ranges below: the embeddings,
  // a block or the tail) to `buffer`, which holds that range alone (ZeRO stage 3's gathered
  // units, Note [ZeRO stage 3]); the views of the rest of `w` stay. A block is bound whole.
  void bind(ModelWeights& w, const Tensor& buffer, ElementRange range) const;

 private:
  void add(std::string name, Shape shape, int layer, ParamRole role, bool decay,
           bool align = true);
  void add_gpt2(const ModelConfig& c);
  void add_llama(const ModelConfig& c);
  // Keeps the parameters of pipeline stage `s` alone, renumbered from its first.
  void keep_stage(const PipelineStage& s);
  // Sets p's slot of w to its view in `base`, which starts at layout element `base_offset`.
  void assign(ModelWeights& w, const Tensor& base, int64_t base_offset, const ParamInfo& p) const;

  std::vector<ParamInfo> params_;
  int64_t total_ = 0;
  int64_t whole_offset_ = 0;
  int64_t qkv_width_ = 0, fc_width_ = 0, d_model_ = 0, n_layer_ = 0;
};

// The layout's units, in order, tiling [0, total): the embeddings (every parameter before block
// 0), block 0, ..., block L-1, the tail (the final norm and an untied head), a tied copy. A unit
// runs from its first parameter's offset to the next unit's, alignment padding included.
// Without --pp unit_ranges(layout)[1 + l] is block l's; a pipeline stage's units are its own
// (its blocks, and the embeddings, tail or tied copy where it holds them): model/unit_map.h says
// which is which, and block_range asks it.
std::vector<ElementRange> unit_ranges(const ParamLayout& layout);
ElementRange block_range(const ParamLayout& layout, int layer);

}  // namespace memfit
