// The search behind --ckpt auto and --auto-batch: plan every checkpoint policy worth trying
// (each also with compressed activations unless --act-compress was given; and, with
// --auto-batch, every micro-batch that keeps the global batch) with plan_training, and take the
// fastest whose predicted peak fits the budget. Nothing is allocated or run.
// Note [Fit a budget] in docs/notes/planner.md: the candidates, the cost model, the ties.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "memfit/memory/category.h"
#include "memfit/model/activation_plan.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

// One configuration the search planned.
struct Candidate {
  std::string ckpt;  // a policy's name, never "auto"
  ActCompress act_compress = ActCompress::none;
  bool offload = false;  // --offload-optimizer nvme
  int batch = 0, grad_accum = 0;
  size_t peak_bytes = 0;
  double est_step_seconds = 0;
  CategoryBytes by_category{};
  bool fits = false;  // peak_bytes <= the search's limit (and, offloaded, the files <= --disk-limit)

  size_t over(size_t limit) const { return peak_bytes > limit ? peak_bytes - limit : 0; }
  Category dominant() const;  // the largest category (the first of equals)
  size_t dominant_bytes() const { return by_category[static_cast<size_t>(dominant())]; }
};

// "--ckpt full", or "--ckpt full --batch 2 --grad-accum 4" with the micro-batch; then
// " --act-compress int8" where the candidate compresses.
std::string candidate_options(const Candidate& c, bool with_batch);

// An estimated step time for tables and messages: "8.57", or "0.000412" when small.
std::string format_seconds(double seconds);

// a is faster than b by more than rounding: estimates within a relative 1e-9 are the same time
// (the micro-batches of one policy have the same FLOPs, up to rounding).
bool faster(const Candidate& a, const Candidate& b);
// a is preferred to b: faster, or the same time and not offloaded, or less memory.
bool preferred(const Candidate& a, const Candidate& b);

// What the search varies: the checkpoint policy (--ckpt auto), the micro-batch (--auto-batch),
// and with the policy, unless --act-compress was given, whether the kept activations are
// compressed (kSearchCompress).
struct SearchSpace {
  bool policies = true;
  bool micro_batches = false;
  bool compression = false;
  // Every candidate also with the optimizer offloaded (--offload-dir without
  // --offload-optimizer: Note [NVMe offload]).
  bool offload = false;
  static SearchSpace of(const RunSpec& spec) {
    return {spec.ckpt_auto, spec.auto_batch, spec.ckpt_auto && spec.act_compress_open,
            spec.offload_open && (spec.ckpt_auto || spec.auto_batch)};
  }
};

// The compression the search and the out-of-memory advice try beside none: int8, whose
// convergence on Brown matched none's (Note [Activation compression] has the runs). fp8 saves
// the same bytes at the same estimated cost, so trying it too would only tie.
inline constexpr ActCompress kSearchCompress = ActCompress::int8;

// The policies worth trying for n_layer blocks, least recomputation first: none; selective
// with plain attention only (with flash it is none); layers:0..k-1 for k in 1..n_layer-1 (the
// blocks are alike, so the first k: Note [Fit a budget] says why the first); every:K for each
// K in 2..n_layer-1 that keeps fewer segment inputs than K-1 (a larger K keeping as many only
// lengthens the longest segment); full.
std::vector<std::string> checkpoint_candidates(int n_layer, AttentionKind attention);

// The micro-batch sizes b that divide the global batch, ascending (grad_accum = global / b).
std::vector<int> micro_batch_candidates(int global_batch);

inline constexpr size_t kRunnerUps = 5;  // SearchResult::slower and ::over keep this many

struct SearchResult {
  size_t limit = 0;
  bool fits = false;  // some candidate fits
  // The fastest candidate that fits, ties to less memory; when nothing fits, the smallest.
  Candidate choice;
  std::vector<Candidate> slower;  // fitting runner-ups, fastest first
  // Over the limit and not slower than the choice, nearest first (when nothing fits: the
  // smallest footprints).
  std::vector<Candidate> over;
  Candidate smallest;  // the least peak of every candidate (ties: faster)
  std::string message;  // one line: the choice, or that nothing fits and its largest part
  bool with_batch = false;  // the micro-batch was searched (options name it)
  std::vector<Candidate> candidates;  // every candidate planned, in enumeration order
};

// Plans every candidate of `space` for `base`, whose policy, compression and micro-batch they
// replace (the policy stays base.ckpt unless space.policies; the compression base's unless
// space.compression, which tries none and kSearchCompress under every policy that keeps some
// block's activations; the micro-batch base's unless space.micro_batches). Throws what
// plan_training throws for a bad base.
SearchResult search_training(const RunSpec& base, size_t limit, SearchSpace space);

// base with the candidate's policy, compression and micro-batch, nothing left to choose: the
// run the planner chose.
RunSpec apply_candidate(const RunSpec& base, const Candidate& c);

}  // namespace memfit
