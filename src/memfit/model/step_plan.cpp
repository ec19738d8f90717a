#include "memfit/model/step_plan.h"

#include <map>

#include "memfit/core/error.h"
#include "memfit/memory/arena.h"
#include "memfit/model/step_context.h"
#include "memfit/model/transformer_step.h"
#include "memfit/model/param_layout.h"

namespace memfit {

namespace {

// Each buffer's lifetime from the schedule: a write opens a span (the buffer's old value is
// dead), each later read extends the current span to itself.
void derive_lifetimes(StepPlan& plan, const std::vector<PhaseUses>& schedule) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < plan.buffers.size(); ++i) index.emplace(plan.buffers[i].tag, i);
  for (int p = 0; p < static_cast<int>(schedule.size()); ++p) {
    const PhaseUses& phase = schedule[p];
    plan.phases.push_back(phase.phase);
    for (const auto& [tag, access] : phase.uses) {
      auto it = index.find(tag);
      MEMFIT_CHECK(it != index.end(), "step plan", "'{}' uses '{}', which is not in the plan",
                   phase.phase.name(), tag);
      std::vector<LiveSpan>& spans = plan.buffers[it->second].lifetime.spans;
      if (access == Access::write) {
        spans.push_back({p, p});
      } else {
        MEMFIT_CHECK(!spans.empty(), "step plan", "'{}' reads '{}' before any phase writes it",
                     phase.phase.name(), tag);
        spans.back().last = p;
      }
    }
  }
  for (const BufferSpec& b : plan.buffers)
    MEMFIT_CHECK(!b.lifetime.spans.empty(), "step plan", "no phase uses '{}'", b.tag);
}

// Note [Gradients by lifetime]: each unit of the f32 gradient slab (model/param_layout.h: the
// embeddings, each block, the tail) as a buffer of the activations arena, pinned at its place
// in the slab so that the slab stays one tensor (the update, clipping and the checks read it
// as ever). A unit is born in the first phase that writes it: block l's backward for block l;
// the LM head for the tied token embedding (the head is the table) or for an untied head (in
// the tail); else the embedding backward for the embeddings, the final norm's backward for the
// tail. It lives to the step's end, where the update reads it: the activations placed around
// it are those that died before it was born.
void add_grad_units(StepPlan& plan, const ModelConfig& config) {
  const std::vector<ElementRange> units = unit_ranges(ParamLayout(config));
  const int last = static_cast<int>(plan.phases.size()) - 1;
  auto born = [&](const Phase& phase) {
    for (int p = 0; p <= last; ++p)
      if (plan.phases[static_cast<size_t>(p)] == phase) return p;
    MEMFIT_THROW(Error, "step plan", "no phase '{}' writes gradients", phase.name());
  };
  const bool tied = config.tie_embeddings;
  for (size_t u = 0; u < units.size(); ++u) {
    const int layer = static_cast<int>(u) - 1;
    const bool block = u > 0 && u + 1 < units.size();
    const PhaseKind edge = u == 0 ? (tied ? PhaseKind::lm_head : PhaseKind::embedding_backward)
                                  : (tied ? PhaseKind::final_norm_backward : PhaseKind::lm_head);
    const Phase first = block ? Phase{PhaseKind::backward, layer} : Phase{edge};
    BufferSpec b{block ? "grads.block." + std::to_string(layer)
                       : (u == 0 ? "grads.embeddings" : "grads.tail"),
                 {units[u].size()}, DType::f32, Category::grads, {}, 0};
    b.lifetime.spans = {{born(first), last}};
    b.offset = static_cast<size_t>(units[u].begin) * sizeof(float);
    b.pinned = true;
    plan.buffers.push_back(std::move(b));
  }
}

StepPlan plan_as_given(const ModelConfig& config, int B, int T, const ActivationOptions& options) {
  StepPlan plan;
  plan.B = B;
  plan.T = T;
  plan.options = options;
  plan.lm_head_chunk_asked = options.lm_head_chunk;
  StepContext ctx;
  TransformerStep step(config, options, B, T);
  const ModelWeights none = ParamLayout(config).views(Tensor{});
  step.forward(ctx, none, none, nullptr, nullptr, /*training=*/!options.inference, 0);
  if (!options.inference) step.backward(ctx, none, none);
  plan.buffers = ctx.buffers();
  derive_lifetimes(plan, ctx.schedule());
  if (options.grads_in_arena) add_grad_units(plan, config);
  layout_arenas(plan);
  return plan;
}

size_t arena_bytes(const StepPlan& plan) {
  return plan.arena[static_cast<size_t>(Category::activations)] +
         plan.arena[static_cast<size_t>(Category::workspace)];
}

}  // namespace

StepPlan plan_step(const ModelConfig& config, int B, int T, const ActivationOptions& options) {
  if (options.lm_head_chunk > 0) return plan_as_given(config, B, T, options);
  // The LM head's chunk, where not asked for (Note [Fused LM head], "The chunk"): the route's
  // default, doubled for as long as the arenas come out no larger (the head then shares bytes
  // another phase needs anyway, and its weight is read and widened, and its gradient read and
  // written, half as often each time).
  ActivationOptions o = options;
  o.lm_head_chunk = static_cast<int>(default_lm_head_chunk(options));
  StepPlan plan = plan_as_given(config, B, T, o);
  while (int64_t{2} * o.lm_head_chunk <= int64_t{B} * T) {
    o.lm_head_chunk *= 2;
    StepPlan twice = plan_as_given(config, B, T, o);
    if (arena_bytes(twice) > arena_bytes(plan)) break;
    plan = std::move(twice);
  }
  plan.lm_head_chunk_asked = 0;
  return plan;
}

void layout_arenas(StepPlan& plan) {
  plan.arena = {};
  for (Category c : {Category::activations, Category::workspace}) {
    std::vector<size_t> which, bytes;
    std::vector<Lifetime> lifetimes;
    std::vector<std::optional<size_t>> pinned;
    for (size_t i = 0; i < plan.buffers.size(); ++i) {
      const BufferSpec& b = plan.buffers[i];
      if (arena_category(b.category) != c) continue;
      which.push_back(i);
      bytes.push_back(b.bytes());
      lifetimes.push_back(b.lifetime);
      pinned.push_back(b.pinned ? std::optional<size_t>(b.offset) : std::nullopt);
    }
    const ArenaLayout layout = assign_offsets(bytes, lifetimes, pinned);
    for (size_t k = 0; k < which.size(); ++k) plan.buffers[which[k]].offset = layout.offsets[k];
    plan.arena[static_cast<size_t>(c)] = layout.bytes;
  }
  plan.live.assign(plan.phases.size(), {});
  for (const BufferSpec& b : plan.buffers) {
    MEMFIT_CHECK(b.category == Category::activations || b.category == Category::workspace ||
                     b.category == Category::grads,
                 "step plan", "'{}' is neither activations, workspace nor gradients", b.tag);
    for (const LiveSpan& s : b.lifetime.spans)
      for (int p = s.first; p <= s.last; ++p) {
        PhaseBytes& live = plan.live[static_cast<size_t>(p)];
        (b.category == Category::activations ? live.activations
         : b.category == Category::workspace ? live.workspace
                                             : live.grads) += b.bytes();
      }
  }
}

std::string arena_tag(Category category) {
  return std::string(category_name(category)) + " arena";
}

Category arena_category(Category category) {
  return category == Category::grads ? Category::activations : category;
}

int StepPlan::peak_phase() const {
  int peak = 0;
  for (int p = 1; p < static_cast<int>(live.size()); ++p)
    if (live[p].total() > live[peak].total()) peak = p;
  return peak;
}

bool StepPlan::shares_bytes(size_t i) const {
  const BufferSpec& a = buffers[i];
  for (size_t j = 0; j < buffers.size(); ++j) {
    const BufferSpec& b = buffers[j];
    if (j != i && arena_category(b.category) == arena_category(a.category) &&
        b.offset < a.offset + a.bytes() &&
        a.offset < b.offset + b.bytes())
      return true;
  }
  return false;
}

}  // namespace memfit
