// The step plan: the buffers the step's code declares (Note [One step description],
// step_context.h) with the lifetimes its phases give them, their offsets in one arena per
// category (arena.h), and the bytes live in each phase. Transformer::reserve allocates the
// arenas and makes every buffer a view at its offset; the planner (plan/memory_plan.h) reads
// the same plan without allocating. See docs/notes/planner.md, Note [Step arena].
#pragma once

#include <string>
#include <vector>

#include "memfit/memory/category.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/step_schedule.h"

namespace memfit {

// Bytes of the buffers live in one phase (grads: the gradient units of a plan that keeps them
// in the activations arena, Note [Gradients by lifetime]; else 0).
struct PhaseBytes {
  size_t activations = 0, workspace = 0, grads = 0;
  size_t total() const { return activations + workspace + grads; }
};

struct StepPlan {
  int B = 0, T = 0;
  ActivationOptions options;     // as planned: lm_head_chunk is the chunk the step takes
  int lm_head_chunk_asked = 0;   // options.lm_head_chunk as asked (0: plan_step's choice)
  std::vector<Phase> phases;        // the schedule, in order
  std::vector<BufferSpec> buffers;  // in the order of their first write, with lifetime and offset
  // Each arena's bytes by its category (activations, workspace; else 0). With
  // options.grads_in_arena the activations arena holds the gradient units too.
  CategoryBytes arena{};
  std::vector<PhaseBytes> live;     // one per phase

  // The phase where live activations and workspace together peak (the first, if tied).
  int peak_phase() const;
  // Whether buffer i shares a byte of its arena with another buffer.
  bool shares_bytes(size_t i) const;
};

// Runs the step's code in planning mode (no weights, no kernels) for micro-batches of B x T and
// lays out what it recorded. Where options.lm_head_chunk is 0 it chooses the chunk (the route's
// default, or twice it where that costs no arena byte) and records it in the plan's options. Throws ConfigError for options with no plan
// (check_activation_options); an Error if the code reads a buffer before any phase writes it
// or declares one tag two ways: a bug, caught by every test that reserves.
StepPlan plan_step(const ModelConfig& config, int B, int T, const ActivationOptions& options);

// The tag of a category's arena, the one pool allocation that holds its buffers: "activations
// arena", "workspace arena" (the profiler finds the arenas among the pool's events by it).
std::string arena_tag(Category category);
// The arena a buffer of `category` lives in: its own; the gradient units' is the activations'.
Category arena_category(Category category);

// Assigns each category's offsets from the buffers' lifetimes and recounts `arena` and `live`.
// plan_step calls it; call it again after changing a lifetime (as tests do).
void layout_arenas(StepPlan& plan);

}  // namespace memfit
