#include "memfit/model/param_layout.h"

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/model/model_config.h"
#include "memfit/model/model_family.h"
#include "memfit/model/unit_map.h"

namespace memfit {

namespace {
constexpr int64_t kAlignElements = 16;

// The LM head is the token table (tied): the layout has the final norm and no head of its own.
// A pipeline stage before the last has neither, and its head view stays undefined.
bool head_is_table(const std::vector<ParamInfo>& ps) {
  bool final_norm = false;
  for (const ParamInfo& p : ps) {
    if (p.role == ParamRole::lm_head) return false;
    final_norm = final_norm || (p.layer < 0 && p.role == ParamRole::norm_weight);
  }
  return final_norm;
}
}

ParamLayout::ParamLayout(const ModelConfig& c)
    : d_model_(c.d_model), n_layer_(c.n_layer) {
  qkv_width_ = c.qkv_width();
  fc_width_ = c.fc_width();
  switch (c.family) {  // exhaustive (-Werror=switch): a new family says its names here
    case Family::gpt2: add_gpt2(c); break;
    case Family::llama: add_llama(c); break;
  }
  if (!c.pipelined()) return;
  const ParamInfo table = params_.front();  // the token table starts every family's layout
  keep_stage(c.stage);
  // Tied embeddings (Note [Pipeline parallel], "Tied embeddings"): the last stage holds a copy
  // of the token table for its LM head, under the table's name, after the final norm (its own
  // unit: unit_ranges); the first and last stages sum their gradients after the backward.
  if (c.tie_embeddings && c.stage.has_head())
    add(table.name, table.shape, -1, ParamRole::token_embedding, table.decay);
}

// The layout is layer-major (embeddings, blocks 0..L-1, the final norm and the head), so a
// stage's parameters are one run of it: from its first parameter's offset to the next stage's
// first (or the end), alignment padding included. Every stage starts at a block or at the
// embeddings, which are 16-element aligned, so the offsets shift without moving any alignment.
void ParamLayout::keep_stage(const PipelineStage& s) {
  auto owned = [&](const ParamInfo& p) {
    if (p.layer >= 0) return p.layer >= s.first && p.layer < s.last;
    if (p.role == ParamRole::token_embedding || p.role == ParamRole::position_embedding)
      return s.has_embeddings();
    return s.has_head();
  };
  std::vector<ParamInfo> kept;
  int64_t begin = -1, end = total_;
  bool closed = false;  // a parameter of a later stage came after this stage's
  for (const ParamInfo& p : params_) {
    if (owned(p)) {
      MEMFIT_CHECK(!closed, "params", "stage {}'s parameters are not one run of the layout",
                   s.index);
      if (begin < 0) begin = p.offset;
      kept.push_back(p);
    } else if (begin >= 0 && !closed) {
      end = p.offset;  // the next stage's first parameter
      closed = true;
    }
  }
  MEMFIT_CHECK(begin >= 0 && begin % kAlignElements == 0, "params",
               "stage {} of {} holds no aligned parameters", s.index, s.stages);
  for (ParamInfo& p : kept) p.offset -= begin;
  params_ = std::move(kept);
  whole_offset_ = begin;
  total_ = end - begin;
}

// `align`: round the next parameter's offset up to 16 elements. Off inside a fused group, whose
// members must be adjacent so the group is one matrix.
void ParamLayout::add(std::string name, Shape shape, int layer, ParamRole role, bool decay,
                      bool align) {
  const int64_t numel = shape.numel();
  params_.push_back({std::move(name), shape, total_, numel, layer, role, decay});
  total_ += align ? (numel + kAlignElements - 1) / kAlignElements * kAlignElements : numel;
}

// Under tensor parallelism (c.tp > 1, Note [Tensor parallel]) each rank's layout has the same
// names with its own shapes: the column-parallel layers' rows (c_attn's q, k and v rows of its
// heads, side by side; c_fc's), the row-parallel layers' columns (attn.c_proj, mlp.c_proj) and
// its slice of the vocabulary's rows; norms, positions and the row-parallel biases whole.
void ParamLayout::add_gpt2(const ModelConfig& c) {
  const int64_t C = c.d_model, Q = c.qkv_width(), A = c.attn_width(), F = c.fc_width();
  add("wte.weight", {c.local_vocab(), C}, -1, ParamRole::token_embedding, true);
  add("wpe.weight", {c.max_seq_len, C}, -1, ParamRole::position_embedding, true);
  const std::string_view prefix = model_family(c.family).block_prefix;
  for (int l = 0; l < c.n_layer; ++l) {
    auto n = [&](const char* rest) { return fmt::format("{}.{}.{}", prefix, l, rest); };
    add(n("ln_1.weight"), {C}, l, ParamRole::norm_weight, false);
    add(n("ln_1.bias"), {C}, l, ParamRole::norm_bias, false);
    add(n("attn.c_attn.weight"), {Q, C}, l, ParamRole::attn_qkv_weight, true);
    add(n("attn.c_attn.bias"), {Q}, l, ParamRole::linear_bias, false);
    add(n("attn.c_proj.weight"), {C, A}, l, ParamRole::attn_proj_weight, true);
    add(n("attn.c_proj.bias"), {C}, l, ParamRole::linear_bias, false);
    add(n("ln_2.weight"), {C}, l, ParamRole::norm_weight, false);
    add(n("ln_2.bias"), {C}, l, ParamRole::norm_bias, false);
    add(n("mlp.c_fc.weight"), {F, C}, l, ParamRole::mlp_fc_weight, true);
    add(n("mlp.c_fc.bias"), {F}, l, ParamRole::linear_bias, false);
    add(n("mlp.c_proj.weight"), {C, F}, l, ParamRole::mlp_proj_weight, true);
    add(n("mlp.c_proj.bias"), {C}, l, ParamRole::linear_bias, false);
  }
  add("ln_f.weight", {C}, -1, ParamRole::norm_weight, false);
  add("ln_f.bias", {C}, -1, ParamRole::norm_bias, false);
}

// Hugging Face LlamaForCausalLM's names, so checkpoints map one to one (under tensor
// parallelism each rank's slices, as add_gpt2's).
void ParamLayout::add_llama(const ModelConfig& c) {
  const int64_t C = c.d_model, hs = c.head_size(), F = c.local_ffn();
  const int64_t q = int64_t{c.local_heads()} * hs, kv = int64_t{c.local_kv_heads()} * hs;
  add("model.embed_tokens.weight", {c.local_vocab(), C}, -1, ParamRole::token_embedding, true);
  const std::string_view prefix = model_family(c.family).block_prefix;
  for (int l = 0; l < c.n_layer; ++l) {
    auto n = [&](const char* rest) { return fmt::format("{}.{}.{}", prefix, l, rest); };
    add(n("input_layernorm.weight"), {C}, l, ParamRole::norm_weight, false);
    add(n("self_attn.q_proj.weight"), {q, C}, l, ParamRole::attn_q_weight, true, false);
    add(n("self_attn.k_proj.weight"), {kv, C}, l, ParamRole::attn_k_weight, true, false);
    add(n("self_attn.v_proj.weight"), {kv, C}, l, ParamRole::attn_v_weight, true);
    add(n("self_attn.o_proj.weight"), {C, q}, l, ParamRole::attn_proj_weight, true);
    add(n("post_attention_layernorm.weight"), {C}, l, ParamRole::norm_weight, false);
    add(n("mlp.gate_proj.weight"), {F, C}, l, ParamRole::mlp_gate_weight, true, false);
    add(n("mlp.up_proj.weight"), {F, C}, l, ParamRole::mlp_up_weight, true);
    add(n("mlp.down_proj.weight"), {C, F}, l, ParamRole::mlp_proj_weight, true);
  }
  add("model.norm.weight", {C}, -1, ParamRole::norm_weight, false);
  if (!c.tie_embeddings) add("lm_head.weight", {c.local_vocab(), C}, -1, ParamRole::lm_head, true);
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return p;
  MEMFIT_THROW(Error, "params", "no parameter named '{}'", name);
}

Tensor ParamLayout::view(const Tensor& slab, const ParamInfo& p) const {
  MEMFIT_CHECK_SHAPE(slab.numel() == total_, "params", "slab of {} elements for a layout of {}",
                     slab.numel(), total_);
  return slab.view(p.offset, p.shape);
}

ModelWeights ParamLayout::views(const Tensor& slab) const {
  ModelWeights w;
  w.blocks.resize(n_layer_);
  if (!slab.defined()) return w;
  MEMFIT_CHECK_SHAPE(slab.numel() == total_, "params", "slab of {} elements for a layout of {}",
                     slab.numel(), total_);
  for (const ParamInfo& p : params_) assign(w, slab, 0, p);
  if (!w.head.defined() && head_is_table(params_)) w.head = w.tok_emb;
  return w;
}

bool is_linear_weight(ParamRole role) {
  switch (role) {
    case ParamRole::attn_qkv_weight:
    case ParamRole::attn_q_weight:
    case ParamRole::attn_k_weight:
    case ParamRole::attn_v_weight:
    case ParamRole::attn_proj_weight:
    case ParamRole::mlp_fc_weight:
    case ParamRole::mlp_gate_weight:
    case ParamRole::mlp_up_weight:
    case ParamRole::mlp_proj_weight: return true;
    default: return false;
  }
}

namespace {

bool block_linear(const ParamInfo& p) { return p.layer >= 0 && is_linear_weight(p.role); }

}  // namespace

std::vector<int64_t> ParamLayout::compact_offsets(int64_t* total) const {
  std::vector<int64_t> out;
  out.reserve(params_.size());
  int64_t at = 0;
  for (const ParamInfo& p : params_) {
    if (block_linear(p)) {
      out.push_back(-1);
      continue;
    }
    out.push_back(at);
    at += (p.numel + 15) / 16 * 16;
  }
  if (total) *total = at;
  return out;
}

ModelWeights ParamLayout::views_without_linears(const Tensor& compact) const {
  ModelWeights w;
  w.blocks.resize(n_layer_);
  int64_t total = 0;
  const std::vector<int64_t> at = compact_offsets(&total);
  MEMFIT_CHECK_SHAPE(compact.numel() == total, "params",
                     "a compact slab of {} elements for a layout of {} without its linears",
                     compact.numel(), total);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    // A linear weight gets a stand-in view, which GPT-2's biases (assigned by which weights
    // came before them) need, cleared below.
    if (at[i] < 0) {
      BlockWeights& b = w.blocks[static_cast<size_t>(p.layer)];
      const Tensor stand_in = compact.view(0, {1});
      switch (p.role) {
        case ParamRole::attn_qkv_weight:
        case ParamRole::attn_q_weight: b.qkv_w = stand_in; break;
        case ParamRole::attn_proj_weight: b.attn_out_w = stand_in; break;
        case ParamRole::mlp_fc_weight:
        case ParamRole::mlp_gate_weight: b.fc_w = stand_in; break;
        case ParamRole::mlp_proj_weight: b.mlp_out_w = stand_in; break;
        default: break;
      }
    } else {
      assign(w, compact, p.offset - at[i], p);
    }
  }
  for (BlockWeights& b : w.blocks) b.qkv_w = b.attn_out_w = b.fc_w = b.mlp_out_w = Tensor{};
  if (!w.head.defined() && head_is_table(params_)) w.head = w.tok_emb;
  return w;
}

void ParamLayout::bind(ModelWeights& w, const Tensor& buffer, ElementRange range) const {
  MEMFIT_CHECK_SHAPE(buffer.numel() >= range.size(), "params",
                     "a buffer of {} elements for a range of {}", buffer.numel(), range.size());
  w.blocks.resize(n_layer_);
  // Clear what the range holds first: assign() fills a block's biases in order.
  for (const ParamInfo& p : params_) {
    if (p.offset < range.begin || p.offset >= range.end) continue;
    if (p.layer >= 0) {
      w.blocks[p.layer] = BlockWeights{};
    } else if (p.role == ParamRole::token_embedding) {
      w.tok_emb = Tensor{};
    } else if (p.role == ParamRole::position_embedding) {
      w.pos_emb = Tensor{};
    } else if (p.role == ParamRole::lm_head) {
      w.head = Tensor{};
    } else {
      w.norm_w = w.norm_b = Tensor{};
    }
  }
  bool has_head = false;
  for (const ParamInfo& p : params_) {
    has_head = has_head || p.role == ParamRole::lm_head;
    if (p.offset >= range.begin && p.offset < range.end) assign(w, buffer, range.begin, p);
  }
  if (!has_head && head_is_table(params_)) w.head = w.tok_emb;  // tied
}

void ParamLayout::assign(ModelWeights& w, const Tensor& base, int64_t base_offset,
                         const ParamInfo& p) const {
  const int64_t at = p.offset - base_offset;
  Tensor v = base.view(at, p.shape);
  BlockWeights* b = p.layer >= 0 ? &w.blocks[p.layer] : nullptr;
  const bool second_norm = b && b->norm1_w.defined();
  switch (p.role) {
    case ParamRole::token_embedding: w.tok_emb = v; break;
    case ParamRole::position_embedding: w.pos_emb = v; break;
    case ParamRole::lm_head: w.head = v; break;
    case ParamRole::norm_weight:
      (b == nullptr ? w.norm_w : second_norm ? b->norm2_w : b->norm1_w) = v;
      break;
    case ParamRole::norm_bias:
      (b == nullptr ? w.norm_b : b->norm2_w.defined() ? b->norm2_b : b->norm1_b) = v;
      break;
    // The fused groups start at their first member and span the group.
    case ParamRole::attn_qkv_weight:
    case ParamRole::attn_q_weight: b->qkv_w = base.view(at, {qkv_width_, d_model_}); break;
    case ParamRole::mlp_fc_weight:
    case ParamRole::mlp_gate_weight: b->fc_w = base.view(at, {fc_width_, d_model_}); break;
    case ParamRole::attn_k_weight:
    case ParamRole::attn_v_weight:
    case ParamRole::mlp_up_weight: break;
    case ParamRole::attn_proj_weight: b->attn_out_w = v; break;
    case ParamRole::mlp_proj_weight: b->mlp_out_w = v; break;
    case ParamRole::linear_bias:
      // GPT-2's biases follow their weights: c_attn, attn.c_proj, c_fc, mlp.c_proj.
      (!b->attn_out_w.defined() ? b->qkv_b
       : !b->norm2_w.defined()  ? b->attn_out_b
       : !b->mlp_out_w.defined() ? b->fc_b
                                 : b->mlp_out_b) = v;
      break;
  }
}

std::vector<ElementRange> unit_ranges(const ParamLayout& layout) {
  // The layout is layer-major (param_layout.h): embeddings (layer -1), blocks 0..L-1, then the
  // final norm and head (layer -1 again), so a unit starts wherever the layer changes, and at
  // a token table after the first parameter: a tied model's last pipeline stage's copy of the
  // table, after the final norm (Note [Pipeline parallel], "Tied embeddings").
  const auto& ps = layout.params();
  std::vector<ElementRange> out;
  int64_t begin = 0;
  for (size_t i = 1; i < ps.size(); ++i)
    if (ps[i].layer != ps[i - 1].layer || ps[i].role == ParamRole::token_embedding) {
      out.push_back({begin, ps[i].offset});
      begin = ps[i].offset;
    }
  out.push_back({begin, layout.total()});
  return out;
}

ElementRange block_range(const ParamLayout& layout, int layer) {
  // By the block's index in the whole model: a pipeline stage's layout holds its own blocks
  // (model/unit_map.h).
  const UnitMap m = unit_map(layout);
  MEMFIT_CHECK(m.has_block(layer), "shard", "block {} is not in a layout of blocks {} to {}",
               layer, m.first_layer, m.first_layer + m.blocks - 1);
  return m.units[m.block_unit(layer)];
}

}  // namespace memfit
