#include "memfit/model/lora.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/core/error.h"
#include "memfit/model/layout_map.h"
#include "memfit/model/model_family.h"

namespace memfit {

namespace {

constexpr int64_t kAlign = 16;  // elements: 64 bytes of f32, as the parameter slab

// A target: its name, the layer slot and part, and PEFT's module name after the block prefix;
// `whole`: the adapter spans its slot's whole fused matrix (GPT-2's c_attn is q|k|v in one).
struct Target {
  const char* name;
  LinearSlot slot;
  int part;
  const char* module;
  bool whole = false;
};

std::vector<Target> targets_of(Family family) {
  switch (family) {
    case Family::gpt2:
      return {{"attn", LinearSlot::qkv, 0, "attn.c_attn", /*whole=*/true},
              {"proj", LinearSlot::attn_out, 0, "attn.c_proj"},
              {"fc", LinearSlot::fc, 0, "mlp.c_fc"},
              {"mlp_proj", LinearSlot::mlp_out, 0, "mlp.c_proj"}};
    case Family::llama:
      return {{"q", LinearSlot::qkv, 0, "self_attn.q_proj"},
              {"k", LinearSlot::qkv, 1, "self_attn.k_proj"},
              {"v", LinearSlot::qkv, 2, "self_attn.v_proj"},
              {"o", LinearSlot::attn_out, 0, "self_attn.o_proj"},
              {"gate", LinearSlot::fc, 0, "mlp.gate_proj"},
              {"up", LinearSlot::fc, 1, "mlp.up_proj"},
              {"down", LinearSlot::mlp_out, 0, "mlp.down_proj"}};
  }
  return {};
}

}  // namespace

LoraBase lora_base_from_name(std::string_view name) {
  if (name == "bf16") return LoraBase::bf16;
  if (name == "nf4") return LoraBase::nf4;
  if (name == "int8") return LoraBase::int8;
  MEMFIT_THROW(ConfigError, "config", "--base-dtype must be bf16, nf4 or int8, got '{}'", name);
}

std::string_view lora_base_name(LoraBase base) {
  switch (base) {
    case LoraBase::precision: return "precision";
    case LoraBase::bf16: return "bf16";
    case LoraBase::nf4: return "nf4";
    case LoraBase::int8: return "int8";
  }
  return {};
}

std::string peft_block_prefix(Family family) {
  const ModelFamily& f = model_family(family);
  return std::string(f.hf_prefix) + std::string(f.block_prefix);
}

namespace {

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// The chosen targets, in the family's order.
std::vector<Target> chosen(const LoraOptions& o, Family family) {
  const std::vector<Target> all = targets_of(family);
  const std::vector<std::string> names = lora_target_names(family);
  const std::vector<std::string> asked = split(o.targets);
  std::vector<bool> on(all.size(), false);
  for (const std::string& a : asked) {
    if (a == "all-linear" && asked.size() == 1) {
      std::fill(on.begin(), on.end(), true);
      continue;
    }
    const auto it = std::find(names.begin(), names.end(), a);
    if (it == names.end())
      MEMFIT_THROW(ConfigError, "config",
                   "--lora-targets '{}': '{}' is not a {} target; the targets are {} or "
                   "all-linear (alone)",
                   o.targets, a, family_name(family), fmt::join(names, ","));
    const size_t i = static_cast<size_t>(it - names.begin());
    if (on[i])
      MEMFIT_THROW(ConfigError, "config", "--lora-targets '{}' names '{}' twice", o.targets, a);
    on[i] = true;
  }
  std::vector<Target> out;
  for (size_t i = 0; i < all.size(); ++i)
    if (on[i]) out.push_back(all[i]);
  return out;
}

}  // namespace

std::vector<std::string> lora_target_names(Family family) {
  std::vector<std::string> out;
  for (const Target& t : targets_of(family)) out.emplace_back(t.name);
  return out;
}

std::vector<std::string> lora_chosen_targets(const LoraOptions& o, Family family) {
  std::vector<std::string> out;
  for (const Target& t : chosen(o, family)) out.emplace_back(t.name);
  return out;
}

std::string lora_targets_from_modules(const std::vector<std::string>& modules, Family family) {
  const std::vector<Target> all = targets_of(family);
  std::vector<bool> on(all.size(), false);
  for (const std::string& m : modules) {
    bool found = false;
    for (size_t i = 0; i < all.size(); ++i) {
      const std::string full = all[i].module;
      if (full == m || (full.size() > m.size() &&
                        full.compare(full.size() - m.size(), m.size(), m) == 0 &&
                        full[full.size() - m.size() - 1] == '.')) {
        on[i] = true;
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> names;
      for (const Target& t : all) names.emplace_back(t.module);
      MEMFIT_THROW(ConfigError, "lora",
                   "target module '{}' is none of {}'s adapted layers ({})", m,
                   family_name(family), fmt::join(names, ", "));
    }
  }
  if (std::all_of(on.begin(), on.end(), [](bool b) { return b; })) return "all-linear";
  std::vector<std::string> names;
  for (size_t i = 0; i < all.size(); ++i)
    if (on[i]) names.emplace_back(all[i].name);
  return fmt::format("{}", fmt::join(names, ","));
}

void check_lora_options(const LoraOptions& o, Family family) {
  if (o.rank < 1)
    MEMFIT_THROW(ConfigError, "config", "--lora-rank must be at least 1, got {}", o.rank);
  if (!(o.alpha > 0) || !std::isfinite(o.alpha))
    MEMFIT_THROW(ConfigError, "config", "--lora-alpha must be positive, got {}", o.alpha);
  if (!(o.dropout >= 0 && o.dropout < 1))
    MEMFIT_THROW(ConfigError, "config",
                 "--lora-dropout must be in [0, 1) (the probability of dropping an element of "
                 "the adapters' input), got {}",
                 o.dropout);
  (void)chosen(o, family);
}

namespace {

ParamLayout adapter_params(const std::vector<LoraParam>& params, int64_t r, int64_t total) {
  std::vector<ParamInfo> out;
  for (const LoraParam& p : params) {
    // A linear weight's role: Adam-mini keeps one state value per row of it.
    out.push_back({p.module + ".lora_A.weight", Shape{r, p.in}, p.a_offset, r * p.in, p.layer,
                   ParamRole::mlp_fc_weight, true});
    out.push_back({p.module + ".lora_B.weight", Shape{p.out, r}, p.b_offset, p.out * r, p.layer,
                   ParamRole::mlp_fc_weight, true});
  }
  return ParamLayout(std::move(out), total);
}

}  // namespace

LoraLayout::LoraLayout(const ModelConfig& c, const LoraOptions& options)
    : config_(c), options_(options) {
  check_lora_options(options, c.family);
  const std::vector<Target> targets = chosen(options, c.family);
  // This rank's widths (the whole ones at tp 1; Note [LoRA], "Under --tp").
  const int64_t C = c.d_model, hs = c.head_size(), F = c.local_ffn();
  const int64_t q = int64_t{c.local_heads()} * hs, kv = int64_t{c.local_kv_heads()} * hs;
  const int64_t r = options.rank;
  auto take = [&](int64_t n) {
    const int64_t at = total_;
    total_ += (n + kAlign - 1) / kAlign * kAlign;
    return at;
  };
  const std::string prefix = peft_block_prefix(c.family);
  // A pipeline stage's own blocks (Note [LoRA], "Under --pp"), named by their whole-model index.
  const int first = c.pipelined() ? c.stage.first : 0;
  const int last = c.pipelined() ? c.stage.last : c.n_layer;
  for (int l = first; l < last; ++l)
    for (const Target& t : targets) {
      LoraParam p{fmt::format("{}.{}.{}", prefix, l, t.module), l, t.slot, t.part, 0, 0, 0, 0, 0};
      switch (t.slot) {
        case LinearSlot::qkv:
          p.in = C;
          p.out = t.whole ? c.qkv_width() : t.part == 0 ? q : kv;
          p.row0 = t.part == 0 ? 0 : t.part == 1 ? q : q + kv;
          break;
        case LinearSlot::attn_out: p.in = c.attn_width(); p.out = C; break;
        case LinearSlot::fc:
          p.in = C;
          p.out = F;  // GPT-2's one c_fc, or LLaMA's gate or up
          p.row0 = t.part * F;
          break;
        case LinearSlot::mlp_out:
          p.in = F;
          p.out = C;
          break;
      }
      p.a_offset = take(r * p.in);
      p.b_offset = take(p.out * r);
      params_.push_back(std::move(p));
    }
  as_params_ = adapter_params(params_, r, total_);
}

namespace {

// Megatron's halves (Note [Parallel linears]): the output projections split their input
// features, the other linears their output features.
bool row_parallel_slot(LinearSlot slot) {
  return slot == LinearSlot::attn_out || slot == LinearSlot::mlp_out;
}

// A column-parallel adapter's B rows of tensor rank `rank` as (local row, whole row, rows)
// pieces: its heads' (GPT-2's fused c_attn: of q, k and v each; a key/value head replicated
// above n_kv_head: the one its queries use) or its MLP rows.
std::vector<SliceRun> column_rows(const ModelConfig& c, const LoraParam& p, int rank) {
  const int64_t hs = c.head_size();
  const int64_t q = int64_t{c.local_heads()} * hs, kv = int64_t{c.local_kv_heads()} * hs;
  const int64_t q0 = rank * q, kv0 = int64_t{rank} * c.n_kv_head / c.tp * hs;
  const int64_t qw = int64_t{c.n_head} * hs, kvw = int64_t{c.n_kv_head} * hs;
  if (p.slot == LinearSlot::fc) return {{0, rank * p.out, p.out}};
  if (p.out == c.qkv_width())  // GPT-2's one adapter over q|k|v
    return {{0, q0, q}, {q, qw + kv0, kv}, {q + kv, qw + kvw + kv0, kv}};
  return {{0, p.part == 0 ? q0 : kv0, p.out}};
}

}  // namespace

LoraLayout LoraLayout::whole() const { return LoraLayout(whole_run_model(config_), options_); }

std::vector<SliceRun> LoraLayout::whole_runs(int rank) const {
  const LoraLayout w = whole();
  const int64_t r = options_.rank;
  // A stage's adapters are the whole's from its first block's, in the same order.
  const size_t first = params_.empty() ? 0
                       : static_cast<size_t>(params_.front().layer) *
                             lora_chosen_targets(options_, config_.family).size();
  std::vector<SliceRun> runs;
  for (size_t i = 0; i < params_.size(); ++i) {
    const LoraParam &p = params_[i], &q = w.params_[first + i];
    if (row_parallel_slot(p.slot) && p.in != q.in) {  // A's columns of the rank, row by row
      for (int64_t k = 0; k < r; ++k)
        runs.push_back({p.a_offset + k * p.in, q.a_offset + k * q.in + rank * p.in, p.in});
    } else {
      runs.push_back({p.a_offset, q.a_offset, r * p.in});
    }
    if (!row_parallel_slot(p.slot) && p.out != q.out) {  // B's rows of the rank
      for (const SliceRun& rows : column_rows(config_, p, rank))
        runs.push_back({p.b_offset + rows.local * r, q.b_offset + rows.whole * r, rows.n * r});
    } else {
      runs.push_back({p.b_offset, q.b_offset, p.out * r});
    }
  }
  return runs;
}

std::vector<ElementRange> LoraLayout::replicated_ranges() const {
  std::vector<ElementRange> out;
  if (config_.tp <= 1) return out;
  const int64_t r = options_.rank;
  for (const LoraParam& p : params_)
    out.push_back(row_parallel_slot(p.slot) ? ElementRange{p.b_offset, p.b_offset + p.out * r}
                                            : ElementRange{p.a_offset, p.a_offset + r * p.in});
  return out;
}

void LoraLayout::bind(ModelWeights& w, const Tensor& slab) const {
  const int64_t r = options_.rank;
  for (BlockWeights& b : w.blocks) b.lora = {};
  if (!slab.defined()) return;
  for (const LoraParam& p : params_) {
    LoraView& v = w.blocks.at(static_cast<size_t>(p.layer)).lora[static_cast<size_t>(p.slot)]
                      [static_cast<size_t>(p.part)];
    v.a = slab.view(p.a_offset, {r, p.in});
    v.b = slab.view(p.b_offset, {p.out, r});
    v.row0 = p.row0;
    v.scale = options_.scale();
  }
}

namespace {

// PEFT's draw of a layout's A matrices into its slab `d` (zeros elsewhere).
void draw_adapters(const std::vector<LoraParam>& params, int64_t rank, int64_t total, float* d,
                   uint64_t seed) {
  std::fill_n(d, total, 0.0f);
  std::mt19937_64 rng(seed ^ 0x4c6f5241ull);  // "LoRA": not the base weights' stream
  for (const LoraParam& p : params) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(p.in));
    std::uniform_real_distribution<float> u(-bound, bound);
    for (int64_t i = 0; i < rank * p.in; ++i) d[p.a_offset + i] = u(rng);
  }
}

}  // namespace

void LoraLayout::init(const Tensor& slab, uint64_t seed, int rank) const {
  MEMFIT_CHECK_SHAPE(slab.numel() == total_ && slab.dtype() == DType::f32, "lora",
                     "an adapter slab of {} f32 elements, got {}", total_, slab.numel());
  float* d = slab.data<float>();
  if (config_.tp <= 1 && !config_.pipelined()) {
    draw_adapters(params_, options_.rank, total_, d, seed);
    return;
  }
  // The whole adapters drawn (on the heap, once, at set-up), this rank's slices (--tp) of its
  // stage's blocks (--pp) kept.
  const LoraLayout w = whole();
  std::vector<float> all(static_cast<size_t>(w.total()));
  draw_adapters(w.params_, options_.rank, w.total(), all.data(), seed);
  std::fill_n(d, total_, 0.0f);
  for (const SliceRun& run : whole_runs(rank))
    std::copy_n(all.data() + run.whole, run.n, d + run.local);
}

}  // namespace memfit
