// The layout search behind `memfit plan --auto --world-size N` when neither --tp nor --pp is
// given (issue 42 item 4, issue 43 item 4): besides the policy, micro-batch and ZeRO stage, the
// split of the N ranks into data x pipeline x tensor. Each layout is planned per rank (the
// largest rank's peak against the per-rank budget) and timed by the step-time estimate (its
// collectives on the links, the pipeline's bubble and transfers); the fastest that fits wins,
// ties to the simpler layout (preferred()). Note [Fit a budget], "Layouts" in
// docs/notes/planner.md: the candidates, the pruning, the cost.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "memfit/plan/run_spec.h"
#include "memfit/plan/search.h"

namespace memfit {

// Without --ranks-per-node the tensor groups are taken up to this many ranks: a node's
// accelerators in the clusters the seeds describe (8 GPUs a node); tensor parallelism across
// nodes is a layout no framework recommends, and the link model would not price it apart.
inline constexpr int kDefaultTensorRanksCap = 8;

// The tensor sizes tried over `ranks` ranks: the divisors of `ranks` up to --ranks-per-node
// (else kDefaultTensorRanksCap), ascending; whether the model splits is checked per layout.
std::vector<int> tensor_candidates(int ranks, int ranks_per_node);
// The pipeline sizes tried over `ranks` ranks (those a tensor group leaves): the divisors of
// `ranks` up to n_layer (a stage holds a block at least), ascending.
std::vector<int> pipeline_candidates(int ranks, int n_layer);

// The coarse policy list of the first pass: checkpoint_candidates without the `layers:0..k-1`
// family (each of those keeps at least full's bytes and takes at most none's time, so where
// none of these fits neither does one of them; the second pass tries them on the chosen layout).
std::vector<std::string> coarse_policies(int n_layer, AttentionKind attention);

// search_training over every layout tp x pp x dp = base.world (base: one tensor rank, one stage,
// so base.world is every rank): tp among tensor_candidates (with --sp where the run accepts it),
// pp among pipeline_candidates, the global batch kept (layout_run). A layout is skipped without
// searching it where its model state alone (params, master, grads, optimizer of its most frugal
// candidate: full recomputation, the highest ZeRO stage and every precision lever the space
// allows, on its largest rank) exceeds `limit`; a layout the run refuses is skipped with the
// refusal. The first pass searches each layout over coarse_policies, the second the remaining
// policies on the chosen layout alone. The result's candidates carry their layout (Candidate::tp,
// ::pp, ::sp: apply_candidate lays the base out), and `layouts` one line per layout.
// `progress`, if given, is told each layout as its search starts ("tp 8 --sp x pp 4 x dp 4",
// its index and the count).
SearchResult search_layouts(
    const RunSpec& base, size_t limit, SearchSpace space,
    const std::function<void(const std::string& layout, int index, int count)>& progress = {});

}  // namespace memfit
