#include "memfit/plan/search.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/memory/pool.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/pipeline_time.h"

namespace memfit {

namespace {

constexpr double kTimeTie = 1e-9;

// The order of the tables: exact estimate, then peak (preferred() picks the choice).
bool by_time(const Candidate& a, const Candidate& b) {
  return std::pair(a.est_step_seconds, a.peak_bytes) <
         std::pair(b.est_step_seconds, b.peak_bytes);
}
bool by_peak(const Candidate& a, const Candidate& b) {
  return std::pair(a.peak_bytes, a.est_step_seconds) <
         std::pair(b.peak_bytes, b.est_step_seconds);
}

std::string message(const SearchResult& r) {
  const size_t planned = r.candidates.size();
  if (r.fits) {
    const Candidate& c = r.choice;
    return fmt::format("{} fits {}{}: predicted peak {} ({} to spare), about {} s a step; "
                       "the fastest of {} configuration{} planned",
                       candidate_options(c, r.with_batch, r.with_stage), format_mib(r.limit),
                       r.per_rank ? " per rank" : "",
                       format_mib(c.peak_bytes), format_mib(r.limit - c.peak_bytes),
                       format_seconds(c.est_step_seconds), planned, planned == 1 ? "" : "s");
  }
  const Candidate& s = r.smallest;
  return fmt::format("nothing fits {}{}: the smallest footprint of the {} configuration{} "
                     "planned is {} ({}{}), {} over; its largest part is {}, {}",
                     format_mib(r.limit), r.per_rank ? " per rank" : "", planned,
                     planned == 1 ? "" : "s", format_mib(s.peak_bytes),
                     candidate_options(s, r.with_batch, r.with_stage),
                     r.per_rank ? fmt::format(", on rank {}", s.peak_rank) : std::string(),
                     format_mib(s.over(r.limit)), category_name(s.dominant()),
                     format_mib(s.dominant_bytes()));
}

// The run with the precision levers of the mask `levers` pulled.
void pull_levers(RunSpec& run, int levers) {
  if (levers & kLeverGradBf16) run.grad_dtype = DType::bf16;
  if (levers & kLeverNoMaster) run.precision.master_weights = false;
}

// The search as asked, then, where nothing fits, every mask of kPrecisionLevers: the same space
// swept once more with the masks innermost (SearchSpace::levers), so the candidates of one
// step plan share it (a mask changes no activation; a sweep a mask plans every step plan again:
// three sweeps where one does). The choice is the one a sweep a mask in turn would make
// (`preferred` takes the fewest levers first); the table holds every mask's candidates. A
// candidate the mask makes invalid (RunSpec::check: pure bf16 with an optimizer that needs
// master weights) is skipped.
SearchResult search_with_levers(const RunSpec& base, size_t limit, SearchSpace space) {
  RunSpec asked = base;
  asked.precision_levers_open = false;
  SearchResult r = search_training(asked, limit, space);
  if (r.fits) return r;
  space.levers.clear();
  for (int lever = 1; lever <= kPrecisionLevers; ++lever) space.levers.push_back(lever);
  SearchResult more;
  try {
    more = search_training(asked, limit, space);
  } catch (const ConfigError&) {
    return r;  // every mask refused
  }
  for (Candidate& c : more.candidates) r.candidates.push_back(std::move(c));
  choose_candidates(r);
  return r;
}

// A pipelined candidate (run.pp() > 1): every stage planned, each on its largest data rank,
// the candidate's peak the largest of any world rank (q = (data x pp + stage) x tp; a stage's
// tensor ranks hold the same shapes), its time the pipeline's step (plan/pipeline_time.h: the
// schedule's slots, the bubble and the transfers on the links).
void plan_stages(const RunSpec& run, Candidate& c, std::vector<StepPlanCache>& caches) {
  const int P = run.pp();
  std::vector<PlanReport> stages;
  c.peak_bytes = 0;
  for (int s = 0; s < P; ++s) {
    const RunSpec st = run.stage(s);
    StepPlanCache* cache = &caches[static_cast<size_t>(s)];
    stages.push_back(plan_training(st, 0, cache));
    int data = 0;
    const PlanReport most = st.world > 1 ? plan_largest_rank(st, &data, nullptr, cache)
                                         : stages.back();
    if (most.peak_bytes > c.peak_bytes || s == 0) {
      c.peak_bytes = most.peak_bytes;
      c.by_category = most.by_category;
      c.peak_rank = (data * P + s) * run.model.tp;
    }
  }
  c.est_step_seconds = plan_pipeline_time(run, stages, machine_calibration()).step;
  c.disk_bytes = 0;
}

bool keeps_some_block(const CheckpointPolicy& policy, int n_layer) {
  const BlockSlots slots = block_slots(policy, n_layer);
  return std::any_of(slots.slot.begin(), slots.slot.end(), [](int s) { return s < 0; });
}

}  // namespace

void choose_candidates(SearchResult& r) {
  r.fits = false;
  r.slower.clear();
  r.over.clear();
  r.smallest = r.candidates.front();
  for (const Candidate& c : r.candidates) {
    if (by_peak(c, r.smallest)) r.smallest = c;
    if (c.fits && (!r.fits || preferred(c, r.choice))) {
      r.choice = c;
      r.fits = true;
    }
  }
  if (!r.fits) r.choice = r.smallest;
  // Every other fitting candidate lost to the choice: slower, or as fast with more memory.
  for (const Candidate& c : r.candidates) {
    const bool chosen = c.ckpt == r.choice.ckpt && c.batch == r.choice.batch &&
                        c.act_compress == r.choice.act_compress &&
                        c.offload == r.choice.offload &&
                        c.offload_params == r.choice.offload_params &&
                        c.offload_grads == r.choice.offload_grads && c.zero == r.choice.zero &&
                        c.levers == r.choice.levers && c.tp == r.choice.tp &&
                        c.pp == r.choice.pp && c.sp == r.choice.sp;
    if (r.fits && c.fits && !chosen) r.slower.push_back(c);
    if (!c.fits && (!r.fits || !faster(r.choice, c))) r.over.push_back(c);
  }
  std::stable_sort(r.slower.begin(), r.slower.end(), by_time);
  std::stable_sort(r.over.begin(), r.over.end(), by_peak);
  if (r.slower.size() > kRunnerUps) r.slower.resize(kRunnerUps);
  if (r.over.size() > kRunnerUps) r.over.resize(kRunnerUps);
  r.message = message(r);
}

Category Candidate::dominant() const {
  size_t best = 0;
  for (size_t i = 1; i < by_category.size(); ++i)
    if (by_category[i] > by_category[best]) best = i;
  return kAllCategories[best];
}

std::string Candidate::why_over(size_t limit, uint64_t disk_limit) const {
  if (peak_bytes > limit || !disk_limit || disk_bytes <= disk_limit)
    return fmt::format("{:.1f} MiB over", static_cast<double>(over(limit)) / (1 << 20));
  return disk_over(disk_bytes, disk_limit);
}

std::string disk_over(uint64_t disk_bytes, uint64_t disk_limit) {
  return fmt::format("the disk: {:.1f} GiB of files > {:.1f} GiB", disk_bytes / 1073741824.0,
                     disk_limit / 1073741824.0);
}

std::string candidate_options(const Candidate& c, bool with_batch, bool with_stage) {
  std::string s = "--ckpt " + c.ckpt;
  if (with_batch) s += fmt::format(" --batch {} --grad-accum {}", c.batch, c.grad_accum);
  if (c.act_compress != ActCompress::none)
    s += fmt::format(" --act-compress {}", act_compress_name(c.act_compress));
  if (c.offload) s += " --offload-optimizer nvme";
  if (c.offload_params) s += " --offload-params nvme";
  if (c.offload_grads) s += " --offload-grads nvme";
  if (with_stage) s += fmt::format(" --zero {}", c.zero);
  if (c.levers & kLeverGradBf16) s += " --grad-dtype bf16";
  if (c.levers & kLeverNoMaster) s += " --master-weights none";
  if (c.tp > 0) s += fmt::format(" --tp {}{} --pp {}", c.tp, c.sp ? " --sp" : "", c.pp);
  return s;
}

std::string format_seconds(double seconds) {
  return seconds >= 0.01 ? fmt::format("{:.2f}", seconds) : fmt::format("{:.3g}", seconds);
}

bool faster(const Candidate& a, const Candidate& b) {
  return a.est_step_seconds < b.est_step_seconds * (1 - kTimeTie);
}

bool preferred(const Candidate& a, const Candidate& b) {
  // The numerics as asked before any speed (the levers are tried only where nothing fits).
  if (a.levers != b.levers) return a.levers < b.levers;
  if (faster(a, b)) return true;
  if (faster(b, a)) return false;
  // As fast: the simpler layout (the layout search's; 0 x 0 is the base's, the same for both).
  if (a.tp * a.pp != b.tp * b.pp) return a.tp * a.pp < b.tp * b.pp;
  if (a.pp != b.pp) return a.pp < b.pp;
  // As fast (the disk hidden behind the update): RAM, which depends on no disk.
  if (a.offload != b.offload) return !a.offload;
  if (a.offload_params != b.offload_params) return !a.offload_params;
  if (a.offload_grads != b.offload_grads) return !a.offload_grads;
  // As fast: the lower stage, fewer collectives (the bytes are in the estimate) and the layout
  // the run would have without ZeRO.
  if (a.zero != b.zero) return a.zero < b.zero;
  return a.peak_bytes < b.peak_bytes;
}

std::vector<std::string> checkpoint_candidates(int n_layer, AttentionKind attention) {
  std::vector<std::string> out = {"none"};
  if (attention == AttentionKind::plain) out.push_back("selective");
  CheckpointPolicy first_k;
  first_k.kind = CheckpointPolicy::Kind::layers;
  for (int k = 1; k < n_layer; ++k) {
    first_k.layers.push_back(k - 1);
    out.push_back(first_k.name());
  }
  auto segments = [n_layer](int K) { return (n_layer + K - 1) / K; };
  for (int K = 2; K < n_layer; ++K)
    if (segments(K) < segments(K - 1)) out.push_back(fmt::format("every:{}", K));
  out.push_back("full");
  return out;
}

std::vector<int> micro_batch_candidates(int global_batch) {
  std::vector<int> out;
  for (int b = 1; b <= global_batch; ++b)
    if (global_batch % b == 0) out.push_back(b);
  return out;
}

RunSpec layout_run(const RunSpec& base, int tp, int pp, bool sp) {
  MEMFIT_CHECK(base.model.tp == 1 && base.pp() == 1 && tp >= 1 && pp >= 1 &&
                   base.world % (tp * pp) == 0,
               "plan", "a layout of tp {} x pp {} from {} ranks of tp {} x pp {}", tp, pp,
               base.world, base.model.tp, base.pp());
  RunSpec r = base;
  if (tp > 1) r.model.set_tensor_parallel(tp);
  r.sp = sp && tp > 1;
  if (pp > 1) r.pipeline = split_stages_evenly(r.model.n_layer, pp);
  r.pp_layers_auto = pp > 1;
  r.world = base.world / (tp * pp);
  r.grad_accum = base.grad_accum * tp * pp;
  return r;
}

RunSpec apply_candidate(const RunSpec& base, const Candidate& c) {
  RunSpec t = c.tp > 0 ? layout_run(base, c.tp, c.pp, c.sp) : base;
  t.ckpt = CheckpointPolicy::parse(c.ckpt);
  t.ckpt_auto = false;
  t.act_compress = c.act_compress;
  t.act_compress_open = false;
  t.batch = c.batch;
  t.grad_accum = c.grad_accum;
  t.auto_batch = false;
  t.offload.optimizer = c.offload;
  t.offload.params = c.offload_params;
  t.offload.grads = c.offload_grads;
  t.offload_grads_open = false;
  t.offload_open = false;
  // It bounds offload files: a run in RAM has none.
  if (!c.offload && !c.offload_params) t.offload.disk_limit = 0;
  t.zero = c.zero;
  t.zero_auto = false;
  pull_levers(t, c.levers);
  t.precision_levers_open = false;
  return t;
}

SearchResult search_training(const RunSpec& base, size_t limit, SearchSpace space) {
  if (base.precision_levers_open && base.precision.precision == Precision::bf16)
    return search_with_levers(base, limit, space);
  if (!space.policies && base.ckpt_auto)
    MEMFIT_THROW(ConfigError, "plan", "--ckpt auto: the search must vary the policy");
  // The run's other settings, checked once, before any candidate is planned (as a candidate
  // is: what the search chooses is not "auto" there).
  RunSpec probe = base;
  if (space.policies) probe.ckpt = CheckpointPolicy{};
  if (base.pp() > 1) probe.ckpt_auto = probe.auto_batch = probe.zero_auto = false;
  probe.check();
  const std::vector<std::string> policies =
      !space.policies ? std::vector<std::string>{base.ckpt.name()}
      : space.policy_list.empty() ? checkpoint_candidates(base.model.n_layer, base.attention)
                                  : space.policy_list;
  const int global = base.batch * base.grad_accum;
  const std::vector<int> batches =
      space.micro_batches ? micro_batch_candidates(global) : std::vector<int>{base.batch};
  const std::vector<ActCompress> compressions =
      space.compression ? std::vector<ActCompress>{ActCompress::none, kSearchCompress}
                        : std::vector<ActCompress>{base.act_compress};
  // 0: in RAM; 1: the optimizer offloaded; 2: the working weights too (in one process, or at
  // stage 3 each rank's shard: RunSpec::check).
  // LoRA (Note [LoRA], "The frozen base on disk"): the adapters' optimizer stays in RAM, so
  // level 2 is the frozen base's file alone, and there is no level 1.
  const bool frozen = base.lora.enabled();
  std::vector<int> offloads = {base.offload.params ? 2 : base.offload.optimizer ? 1 : 0};
  if (space.offload) offloads = frozen ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2};
  // Each offloaded level also with the gradients on disk, where they may be (one process, the
  // optimizer offloaded: RunSpec::check): (level, --offload-grads).
  std::vector<std::pair<int, bool>> levels;
  for (int level : offloads) {
    levels.emplace_back(level, level >= 1 && base.offload.grads);
    if (level >= 1 && space.offload_grads && base.world == 1 && !base.offload.grads && !frozen)
      levels.emplace_back(level, true);
  }
  const std::vector<int> stages =
      space.stages ? std::vector<int>(std::begin(kSearchStages), std::end(kSearchStages))
                   : std::vector<int>{base.zero};

  SearchResult r;
  r.limit = limit;
  r.disk_limit = base.offload.disk_limit;
  r.with_batch = space.micro_batches;
  r.with_stage = space.stages;
  r.per_rank = base.world > 1;
  StepPlanCache steps;  // the candidates of one policy, compression and micro-batch share one
  // Under --pp, one a stage (each stage's model is its own).
  std::vector<StepPlanCache> stage_steps(static_cast<size_t>(base.pp()));
  std::string refusal;  // the first candidate RunSpec::check refused (none may be left)
  StateOptions at_stage = base.state_options();  // the base's, at the stage being tried
  for (const std::string& policy : policies)
    for (ActCompress compress : compressions) {
      // A policy that recomputes every block keeps nothing to compress: the same run as none.
      if (space.compression && compress != ActCompress::none &&
          !keeps_some_block(CheckpointPolicy::parse(policy), base.model.n_layer))
        continue;
      for (int b : batches)
        for (const auto& [level, offload_grads] : levels)
          for (int stage : stages)
            for (int lever : space.levers) {
              const bool offload = level >= 1;
              // --update-in-backward takes one micro-batch a step (RunSpec::check).
              if (base.update_in_backward && global / b > 1) continue;
              // Offloaded only where each rank's state is a shard (not stage 0 over ranks), the
              // working weights only where they are a shard too (stage 3 over ranks).
              at_stage.zero = stage;
              if (level == 2 && !StatePlacement::allows_params_offload(at_stage, base.world))
                continue;
              // (LoRA's frozen base offloads no optimizer: only where the base is a shard.)
              if (offload && !frozen &&
                  !StatePlacement::allows_optimizer_offload(at_stage, base.world))
                continue;
              // --tp: the search keeps the state in RAM (--offload-optimizer and --offload-params
              // are built under --tp, --offload-grads refused: RunSpec::check_tensor_parallel;
              // the offloaded candidates are not searched yet).
              if (offload && base.model.tp > 1) continue;
              Candidate c;
              c.ckpt = policy;
              c.act_compress = compress;
              c.batch = b;
              c.grad_accum = global / b;
              c.offload = offload && !frozen;
              c.offload_params = level == 2;
              c.offload_grads = offload_grads;
              c.zero = stage;
              c.levers = lever;
              const RunSpec run = apply_candidate(base, c);
              // A combination the run refuses (e.g. under --pp a ZeRO stage, a precision lever
              // or compression not built there, or a policy whose segment crosses a cut) is not
              // a candidate, as the fit advice skips it; what is built later joins by itself.
              try {
                run.check();
              } catch (const ConfigError& e) {
                if (refusal.empty()) refusal = e.what();
                continue;
              }
              if (run.pp() > 1) {
                plan_stages(run, c, stage_steps);
                c.fits = c.peak_bytes <= limit;
                r.candidates.push_back(std::move(c));
                continue;
              }
              const PlanReport p = plan_training(run, 0, &steps);
              c.est_step_seconds = p.est_step_seconds;
              c.peak_bytes = p.peak_bytes;
              c.by_category = p.by_category;
              uint64_t disk = p.disk_bytes;
              if (run.world > 1) {
                // The budget is every rank's: the largest peak must fit, and (offloaded) the
                // largest files --disk-limit, which is per rank too.
                const PlanReport most = plan_largest_rank(run, &c.peak_rank, &disk, &steps);
                c.peak_bytes = most.peak_bytes;
                c.by_category = most.by_category;
              }
              c.disk_bytes = offload ? disk : 0;
              c.fits = c.peak_bytes <= limit &&
                       (!offload || !base.offload.disk_limit || disk <= base.offload.disk_limit);
              r.candidates.push_back(std::move(c));
            }
    }

  if (r.candidates.empty())
    MEMFIT_THROW(ConfigError, "plan", "every configuration the search would plan is refused; "
                 "the first: {}", refusal);
  choose_candidates(r);
  return r;
}

void to_json(nlohmann::json& j, const Candidate& c) {
  j = {{"ckpt", c.ckpt},
       {"act_compress", std::string(act_compress_name(c.act_compress))},
       {"offload", c.offload},
       {"offload_params", c.offload_params},
       {"offload_grads", c.offload_grads},
       {"batch", c.batch},
       {"grad_accum", c.grad_accum},
       {"zero", c.zero},
       {"levers", c.levers},
       {"tp", c.tp},
       {"pp", c.pp},
       {"sp", c.sp},
       {"peak_bytes", c.peak_bytes},
       {"peak_rank", c.peak_rank},
       {"est_step_seconds", c.est_step_seconds},
       {"by_category", c.by_category},
       {"fits", c.fits}};
}

void from_json(const nlohmann::json& j, Candidate& c) {
  c.ckpt = j.at("ckpt").get<std::string>();
  c.act_compress = act_compress_from_name(j.at("act_compress").get<std::string>());
  c.offload = j.at("offload").get<bool>();
  c.offload_params = j.at("offload_params").get<bool>();
  c.offload_grads = j.at("offload_grads").get<bool>();
  c.batch = j.at("batch").get<int>();
  c.grad_accum = j.at("grad_accum").get<int>();
  c.zero = j.at("zero").get<int>();
  c.levers = j.value("levers", 0);
  c.tp = j.value("tp", 0);
  c.pp = j.value("pp", 0);
  c.sp = j.value("sp", false);
  c.peak_bytes = j.at("peak_bytes").get<size_t>();
  c.peak_rank = j.at("peak_rank").get<int>();
  c.est_step_seconds = j.at("est_step_seconds").get<double>();
  c.by_category = j.at("by_category").get<CategoryBytes>();
  c.fits = j.at("fits").get<bool>();
}

}  // namespace memfit
