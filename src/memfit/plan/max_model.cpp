#include "memfit/plan/max_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>

#include "memfit/core/error.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/offload/scratch_file.h"
#include "memfit/plan/memory_plan.h"

namespace memfit {

namespace {

// GPT-2's published (depth, width) points: gpt2, gpt2-medium, gpt2-large, gpt2-xl.
constexpr std::array<std::array<double, 2>, 4> kGpt2Shapes = {
    {{12, 768}, {24, 1024}, {36, 1280}, {48, 1600}}};
// Meta's: Llama 3.2 1B, Llama 2 7B, 13B, 70B.
constexpr std::array<std::array<double, 2>, 4> kLlamaShapes = {
    {{16, 2048}, {32, 4096}, {40, 5120}, {80, 8192}}};

double family_width(const std::array<std::array<double, 2>, 4>& shapes, int n_layer) {
  // The segment that holds n_layer, or the nearest end segment outside them.
  size_t i = 0;
  while (i + 2 < shapes.size() && n_layer > shapes[i + 1][0]) ++i;
  const auto [l0, w0] = shapes[i];
  const auto [l1, w1] = shapes[i + 1];
  return w0 + (n_layer - l0) * (w1 - w0) / (l1 - l0);
}

}  // namespace

FamilyShape gpt2_family_shape(int n_layer) {
  if (n_layer < 1)
    MEMFIT_THROW(ConfigError, "config", "the GPT-2 family has members of 1 layer or more, got {}",
                 n_layer);
  const long units = std::lround(family_width(kGpt2Shapes, n_layer) / kFamilyHeadSize);
  const int heads = static_cast<int>(std::max(1L, units));
  return {n_layer, heads * kFamilyHeadSize, heads};
}

FamilyShape llama_family_shape(const ModelConfig& base, int n_layer) {
  if (n_layer < 1)
    MEMFIT_THROW(ConfigError, "config", "the LLaMA family has members of 1 layer or more, got {}",
                 n_layer);
  const int group = std::max(1, base.n_head / std::max(1, base.n_kv_head));
  // Heads of 128, a multiple of the group so the key/value heads divide them. Under --tp T the
  // key/value heads (and so the query heads) a multiple of T, and the MLP width a multiple of
  // lcm(256, T), so every member splits (ModelConfig::set_tensor_parallel).
  const int tp = std::max(1, base.tp);
  const long units = std::lround(family_width(kLlamaShapes, n_layer) / kLlamaFamilyHeadSize / group);
  const int heads = static_cast<int>((std::max(1L, units) + tp - 1) / tp * tp) * group;
  const int width = heads * kLlamaFamilyHeadSize;
  const double ratio = double(base.ffn_dim) / base.d_model;
  const int multiple = std::lcm(256, tp);
  const int ffn = static_cast<int>(std::ceil(width * ratio / multiple - 1e-9)) * multiple;
  return {n_layer, width, heads, heads / group, ffn};
}

FamilyShape family_shape(const ModelConfig& base, int n_layer) {
  switch (base.family) {
    case Family::gpt2: {
      // Under --tp T the heads rounded up to a multiple of T (and the width with them), so
      // every member splits; at T = 1 the family's own line.
      FamilyShape s = gpt2_family_shape(n_layer);
      const int tp = std::max(1, base.tp);
      s.n_head = (s.n_head + tp - 1) / tp * tp;
      s.d_model = s.n_head * kFamilyHeadSize;
      return s;
    }
    case Family::llama: return llama_family_shape(base, n_layer);
  }
  MEMFIT_THROW(ConfigError, "config", "no depth-to-width line for the {} family",
               family_name(base.family));
}

std::string_view family_shape_rule(Family family) {
  switch (family) {
    case Family::gpt2: return "width = GPT-2's depth-to-width line rounded to 64, heads of 64";
    case Family::llama:
      return "width = Meta's LLaMA depth-to-width line, heads of 128, the preset's key/value "
             "grouping and MLP ratio";
  }
  return "";
}

RunSpec with_family_shape(const RunSpec& base, FamilyShape shape,
                          const std::optional<CheckpointPolicy>& policy) {
  RunSpec c = base;
  c.model.n_layer = shape.n_layer;
  c.model.d_model = shape.d_model;
  c.model.n_head = shape.n_head;
  c.model.n_kv_head = shape.n_kv_head;  // GPT-2's: 0 and 0, which finalize() resolves
  c.model.ffn_dim = shape.ffn_dim;
  c.model.finalize();
  if (base.model.tp > 1) c.model.set_tensor_parallel(base.model.tp);  // family_shape's widths
  c.optim.n_head = c.model.n_head;
  c.ckpt = policy.value_or(CheckpointPolicy{});
  c.ckpt_auto = !policy;
  return c;
}

MaxModelResult find_max_model(const RunSpec& base, size_t limit,
                              const std::optional<CheckpointPolicy>& policy) {
  const ModelConfig& preset = base.model;
  MaxModelResult r;
  r.family = preset.family;
  r.limit = limit;
  r.world = base.world;
  r.policy = policy;
  std::map<int, ShapeFit> planned;
  // With the optimizer offloaded (given, or open to the search: --offload-dir alone), a member
  // must also fit the disk: --disk-limit, else what is free where the files would go. The
  // search then weighs each offloaded candidate's files against it.
  // (LoRA's frozen base may be offloaded alone: Note [LoRA], "The frozen base on disk".)
  const bool may_offload = base.offload.optimizer || base.offload.params || base.offload_open;
  if (may_offload) {
    r.disk_limit = base.offload.disk_limit;
    if (!r.disk_limit) r.disk_limit = offload::free_disk_bytes(base.offload.dir);
  }
  auto fit = [&](int n_layer) -> const ShapeFit& {
    auto it = planned.find(n_layer);
    if (it != planned.end()) return it->second;
    ShapeFit f;
    f.shape = family_shape(preset, n_layer);
    RunSpec c = with_family_shape(base, f.shape, policy);
    if (may_offload) c.offload.disk_limit = r.disk_limit;
    // The whole model's count (under --tp c.model is one rank's slice).
    f.params = whole_model(c.model).num_params();
    // The policy (with_family_shape leaves it to the search unless one is fixed), and what the
    // run leaves open: the micro-batch, the compression, the stage, and with --offload-dir the
    // offload options (the optimizer's, the working weights', the gradients': SearchSpace::of).
    f.search = search_training(c, limit, SearchSpace::of(c));
    if (f.search.choice.offload || f.search.choice.offload_params) {
      // The chosen run's files: the whole layout's in one process; over several ranks each
      // rank's shard's, the largest rank's against the per-rank limit (plan_largest_rank).
      plan_largest_rank(apply_candidate(c, f.search.choice), nullptr, &f.disk_bytes);
      f.disk_fits = f.disk_bytes <= r.disk_limit;
    }
    return planned.emplace(n_layer, std::move(f)).first->second;
  };

  // The smallest footprint grows with the depth (every category does, Note [Max model]), so
  // double until a member does not fit, then bisect.
  int lo = 0, hi = 0;  // lo fits (0: none known), hi does not (0: none known)
  for (int n = 1; n <= kMaxFamilyLayers; n = std::min(2 * n, kMaxFamilyLayers)) {
    if (!fit(n).fits()) {
      hi = n;
      break;
    }
    lo = n;
    if (n == kMaxFamilyLayers) break;
  }
  if (hi == 0) r.capped = true;
  while (lo > 0 && hi > 0 && hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fit(mid).fits() ? lo : hi) = mid;
  }
  r.found = lo > 0;
  const int best = r.found ? lo : 1;
  r.best = fit(best);
  for (int n = std::max(1, best - 2); n <= std::min(kMaxFamilyLayers, best + 2); ++n)
    r.neighbours.push_back(fit(n));
  r.shapes_planned = static_cast<int>(planned.size());
  return r;
}

}  // namespace memfit
