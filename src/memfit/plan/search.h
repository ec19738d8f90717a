// The search behind --ckpt auto, --auto-batch and --zero auto: plan every checkpoint policy
// worth trying (each also with compressed activations unless --act-compress was given; with
// --auto-batch, every micro-batch that keeps the global batch; with --zero auto over several
// ranks, every ZeRO stage of kSearchStages) with plan_training, and take the fastest whose
// predicted peak fits the budget (over several ranks: every rank's peak). Nothing is allocated
// or run.
// Note [Fit a budget] in docs/notes/planner.md: the candidates, the cost model, the ties.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/memory/category.h"
#include "memfit/model/activation_plan.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

// One configuration the search planned.
struct Candidate {
  std::string ckpt;  // a policy's name, never "auto"
  ActCompress act_compress = ActCompress::none;
  bool offload = false;  // --offload-optimizer nvme
  bool offload_params = false;  // --offload-params nvme too (one process)
  bool offload_grads = false;   // --offload-grads nvme too (one process)
  int batch = 0, grad_accum = 0;
  int zero = 0;  // the ZeRO stage (over several ranks)
  // The layout the layout search gave it (plan/layout_search.h): tensor ranks (with --sp where
  // sp), pipeline stages (the even cut, balanced by --pp-layers auto once chosen) and data ranks
  // world / (tp x pp). 0: the base run's layout, not searched.
  int tp = 0, pp = 0;
  bool sp = false;
  // The precision levers the search pulled (RunSpec::precision_levers_open), a mask of
  // kLeverGradBf16 and kLeverNoMaster (0: none). They change the numerics, so a candidate with
  // the milder (the smaller mask) always wins (preferred()).
  int levers = 0;
  // The largest peak of any rank (plan_largest_rank: ranks differ by their shard and receive
  // buffer), and that rank; with one rank, rank 0's.
  size_t peak_bytes = 0;
  int peak_rank = 0;
  double est_step_seconds = 0;
  CategoryBytes by_category{};
  uint64_t disk_bytes = 0;  // its offload files (the largest rank's); 0 in RAM
  bool fits = false;  // peak_bytes <= the search's limit (and, offloaded, the files <= --disk-limit)

  size_t over(size_t limit) const { return peak_bytes > limit ? peak_bytes - limit : 0; }
  // Why it does not fit, for the tables: "512.0 MiB over", or, when the RAM fits and the files
  // do not, "the disk: 12.3 GiB of files > 10.0 GiB".
  std::string why_over(size_t limit, uint64_t disk_limit) const;
  Category dominant() const;  // the largest category (the first of equals)
  size_t dominant_bytes() const { return by_category[static_cast<size_t>(dominant())]; }
};

// A candidate as JSON and back (nlohmann's to_json / from_json): every field, the policy by its
// name and the compression by its. How the ranks of a run agree on one choice (adopt_lead_choice
// in cli/options/resolve_train_spec.h). from_json throws ConfigError for an unknown name.
void to_json(nlohmann::json& j, const Candidate& c);
void from_json(const nlohmann::json& j, Candidate& c);

// "--ckpt full", or "--ckpt full --batch 2 --grad-accum 4" with the micro-batch; then
// " --act-compress int8" where the candidate compresses; then every offload option it turns on
// (--offload-optimizer, --offload-params, --offload-grads); then " --zero 2" with the stage;
// then the precision levers pulled (" --grad-dtype bf16", " --master-weights none"); then, for
// a candidate of the layout search, its layout (" --tp 2 --sp --pp 2", "--tp 1 --pp 1").
std::string candidate_options(const Candidate& c, bool with_batch, bool with_stage = false);
// "the disk: 12.3 GiB of files > 10.0 GiB": offload files over --disk-limit (or the free space).
std::string disk_over(uint64_t disk_bytes, uint64_t disk_limit);

// An estimated step time for tables and messages: "8.57", or "0.000412" when small.
std::string format_seconds(double seconds);

// a is faster than b by more than rounding: estimates within a relative 1e-9 are the same time
// (the micro-batches of one policy have the same FLOPs, up to rounding).
bool faster(const Candidate& a, const Candidate& b);
// a is preferred to b: fewer precision levers pulled, then faster, or the same time and the
// simpler layout (fewer model-parallel ranks tp x pp, then fewer stages), not offloaded, a
// lower ZeRO stage, or less memory.
bool preferred(const Candidate& a, const Candidate& b);

// What the search varies: the checkpoint policy (--ckpt auto), the micro-batch (--auto-batch),
// with the policy, unless --act-compress was given, whether the kept activations are
// compressed (kSearchCompress), and over several ranks with --zero auto the ZeRO stage
// (kSearchStages).
struct SearchSpace {
  bool policies = true;
  bool micro_batches = false;
  bool compression = false;
  // Every candidate also with the optimizer offloaded (--offload-dir without
  // --offload-optimizer: Note [NVMe offload]). Over several ranks only at the stages where the
  // state is sharded (StatePlacement::allows_optimizer_offload): with --zero auto stages 1 to
  // 3, with a fixed stage only if it is one of them. In one process, or at stage 3
  // (StatePlacement::allows_params_offload), also with the working weights offloaded
  // (--offload-params nvme, which needs the optimizer offloaded).
  bool offload = false;
  // In one process, every offloaded candidate (the base's, or the offload space's) also with
  // the gradients on disk (--offload-grads nvme; --offload-dir given without --offload-grads).
  // Its files and I/O are in the plan, priced at the calibrated disk rate like the others.
  bool offload_grads = false;
  // Every candidate at each stage of kSearchStages (--zero auto over several ranks; with one
  // rank every stage is stage 0, so there is nothing to vary).
  bool stages = false;
  // The policies to try where `policies` is set; empty: checkpoint_candidates (the layout
  // search tries a coarse list first, then the rest on the chosen layout).
  std::vector<std::string> policy_list{};
  // The precision levers' masks each candidate is planned with (kLeverGradBf16,
  // kLeverNoMaster), the innermost loop: {0}, as asked, unless search_with_levers sweeps them.
  std::vector<int> levers{0};
  static SearchSpace of(const RunSpec& spec) {
    const bool stages = spec.zero_auto && spec.world > 1;
    const bool searching = spec.ckpt_auto || spec.auto_batch || stages;
    return {spec.ckpt_auto, spec.auto_batch, spec.ckpt_auto && spec.act_compress_open,
            spec.offload_open && searching && !spec.update_in_backward &&
                (stages || StatePlacement::allows_optimizer_offload(spec.state_options(),
                                                                    spec.world)),
            spec.offload_grads_open && searching && spec.world == 1 && !spec.update_in_backward,
            stages};
  }
};

// The precision levers (Candidate::levers), pulled as masks 1, 2, 3 in turn, each only where
// nothing fit at the ones before: bf16 gradients (--grad-dtype bf16: each gradient rounded
// once, the update's m / sqrt(v) dividing most of it out, Note [Gradients in bf16]), then pure
// bf16 (--master-weights none: the weights updated in bf16 with stochastic rounding), then
// both. (bf16 gradients alone can take more than f32 in a small model: their unit buffers.)
inline constexpr int kLeverGradBf16 = 1, kLeverNoMaster = 2;
inline constexpr int kPrecisionLevers = kLeverGradBf16 | kLeverNoMaster;

// The ZeRO stages --zero auto tries over several ranks, lowest first (ties go to the lower:
// preferred()). A stage joins the search by joining this list.
inline constexpr int kSearchStages[] = {0, 1, 2, 3};

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
  uint64_t disk_limit = 0;  // --disk-limit (0: none), which offloaded candidates' files must fit
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
  bool with_stage = false;  // the ZeRO stage was searched (options name it)
  bool per_rank = false;    // over several ranks: the limit is each rank's, peaks the largest
  bool with_layout = false;  // the layout was searched (plan/layout_search.h)
  int world = 0;             // with_layout: every rank, tp x pp x dp
  // With the layout searched: one line per layout tried (chosen, fits and slower, nothing fits,
  // skipped by its model state, refused), then what the times of layouts are.
  std::vector<std::string> layouts;
  std::vector<Candidate> candidates;  // every candidate planned, in enumeration order
};

// Plans every candidate of `space` for `base`, whose policy, compression, micro-batch and stage
// they replace (the policy stays base.ckpt unless space.policies; the compression base's unless
// space.compression, which tries none and kSearchCompress under every policy that keeps some
// block's activations; the micro-batch base's unless space.micro_batches; the stage base.zero
// unless space.stages). A candidate fits when every rank's planned peak fits `limit` (the
// budget is per rank: each rank's pool has --mem-limit). Throws what plan_training throws for
// a bad base.
SearchResult search_training(const RunSpec& base, size_t limit, SearchSpace space);

// base with the candidate's policy, compression, micro-batch, offload and stage (and, from the
// layout search, its layout: with_layout), nothing left to choose: the run the planner chose.
RunSpec apply_candidate(const RunSpec& base, const Candidate& c);

// The run of `base` (one tensor rank, one stage: its world every rank) laid out as tp x pp x
// world / (tp x pp): the model split over `tp` ranks, with --sp where `sp`, cut evenly into
// `pp` stages (--pp-layers auto), and grad_accum times tp x pp micro-batches, so that the
// global batch (data ranks x batch x grad_accum) stays the base's. ConfigError where the model
// does not split so (set_tensor_parallel, split_stages_evenly).
RunSpec layout_run(const RunSpec& base, int tp, int pp, bool sp);

// r's choice (the preferred candidate that fits, else the smallest), runner-ups and message,
// from r.candidates (non-empty); the search calls it, and the layout search once more over
// every layout's candidates.
void choose_candidates(SearchResult& r);

}  // namespace memfit
