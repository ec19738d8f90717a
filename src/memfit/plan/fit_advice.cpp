#include "memfit/plan/fit_advice.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/plan/layout_search.h"

namespace memfit {

namespace {

// The levers, as bits of a set of changes.
// kStage: over several ranks, the ZeRO stage (kSearchStages).
// kGradBf16, kNoMaster: the search's precision levers (kPrecisionLevers in plan/search.h),
// where the run is bf16 (or the set makes it so) and does not keep them already.
enum Lever : unsigned {
  kPolicy = 1,
  kMicroBatch = 2,
  kBf16 = 4,
  kOptim8bit = 8,
  kCompress = 16,
  kStage = 32,
  kGradBf16 = 64,
  kNoMaster = 128
};
constexpr unsigned kAllLevers = 255;

// The 8-bit optimizer with the same update rule, or "" when there is none.
std::string eight_bit(const std::string& optim) {
  if (optim == "adamw") return "adamw8bit";
  if (optim == "lion") return "lion8bit";
  return "";
}

// The options that turn `base` into `c`.
std::string change_text(const RunSpec& base, const RunSpec& c) {
  std::vector<std::string> parts;
  if (c.ckpt != base.ckpt || base.ckpt_auto) parts.push_back("--ckpt " + c.ckpt.name());
  if (c.batch != base.batch || c.grad_accum != base.grad_accum)
    parts.push_back(fmt::format("--batch {} --grad-accum {}", c.batch, c.grad_accum));
  if (c.precision.precision != base.precision.precision)
    parts.push_back(fmt::format("--precision {}", precision_name(c.precision.precision)));
  if (c.optim.name != base.optim.name) parts.push_back("--optim " + c.optim.name);
  if (c.optim.state_dtype != base.optim.state_dtype)
    parts.push_back(
        fmt::format("--optim-state-dtype {}", optim_state_dtype_name(c.optim.state_dtype)));
  if (c.act_compress != base.act_compress)
    parts.push_back(fmt::format("--act-compress {}", act_compress_name(c.act_compress)));
  if (c.world > 1 && (c.zero != base.zero || base.zero_auto))
    parts.push_back(fmt::format("--zero {}", c.zero));
  if (c.grad_dtype != base.grad_dtype) parts.push_back("--grad-dtype bf16");
  if (c.precision.master_weights != base.precision.master_weights)
    parts.push_back("--master-weights none");
  return parts.empty() ? "(as configured)" : fmt::format("{}", fmt::join(parts, " "));
}

struct Tried {
  unsigned levers = 0;
  bool fits = false;
  FitOption fastest;   // the fastest that fits, when one does
  FitOption smallest;  // the least footprint
};

FitOption option(const RunSpec& user, const RunSpec& changed, const Candidate& c) {
  FitOption o;
  o.run = apply_candidate(changed, c);
  o.change = change_text(user, o.run);
  o.plan = c;
  return o;
}

// The run `base` with the levers of `set` pulled (the policy, micro-batch and stage levers are
// the search's space: lever_space), or nothing where the set does not apply (the precision
// levers outside bf16).
std::optional<RunSpec> lever_run(const RunSpec& base, unsigned set) {
  RunSpec c = base;
  c.auto_batch = false;
  if (set & kBf16) {
    c.precision.precision = Precision::bf16;
    c.precision = run_precision(c.precision, c.lora);  // LoRA: the base without master weights
  }
  if (set & kOptim8bit) {
    c.optim.name = eight_bit(c.optim.name);
    c.optim.state_dtype = DType::f32;  // the 8-bit state replaces bf16 moments
  }
  if (set & kCompress) c.act_compress = kSearchCompress;
  if ((set & (kGradBf16 | kNoMaster)) && c.precision.precision != Precision::bf16)
    return std::nullopt;
  if (set & kGradBf16) c.grad_dtype = DType::bf16;
  if (set & kNoMaster) c.precision.master_weights = false;
  c.act_compress_open = false;  // the lever decides it
  return c;
}

// The search's space for `set`: the policies of `policies` (empty: every one) where the set
// varies the policy.
SearchSpace lever_space(unsigned set, std::vector<std::string> policies) {
  SearchSpace space;
  space.policies = (set & kPolicy) != 0;
  space.micro_batches = (set & kMicroBatch) != 0;
  space.stages = (set & kStage) != 0;
  space.policy_list = std::move(policies);
  return space;
}

}  // namespace

FitAdvice advise_fit(const RunSpec& spec, size_t limit) {
  FitAdvice a;
  a.limit = limit;
  const bool resume = spec.resumed;
  RunSpec base = spec;
  if (resume) base.auto_batch = false;  // the trainer keeps the checkpoint's micro-batch
  // The precision levers are the advice's own (kGradBf16, kNoMaster), named in its changes.
  base.precision_levers_open = false;
  unsigned mandatory = 0, allowed = kPolicy;
  if (base.ckpt_auto) mandatory |= kPolicy;
  if (base.auto_batch) mandatory |= kMicroBatch;
  // A resumed run reshards to any stage (Note [ZeRO]), so the stage is a lever even then; not
  // for LoRA, which runs at stage 0 alone (Note [LoRA], "ZeRO and offload").
  if (base.world > 1 && !base.lora.enabled()) allowed |= kStage;
  if (base.zero_auto && base.world > 1) mandatory |= kStage;
  if (!resume) {
    if (base.batch * base.grad_accum > 1) allowed |= kMicroBatch;
    if (base.precision.precision == Precision::fp32) allowed |= kBf16;
    if (!eight_bit(base.optim.name).empty()) allowed |= kOptim8bit;
    if (base.act_compress == ActCompress::none) allowed |= kCompress;
    // In bf16, or where kBf16 makes it so; a set the run's options refuse is skipped below.
    if (base.precision.precision == Precision::bf16 || (allowed & kBf16)) {
      if (base.grad_dtype == DType::f32 && !base.update_in_backward) allowed |= kGradBf16;
      if (base.precision.master_weights && !base.lora.enabled()) allowed |= kNoMaster;
    }
  }
  allowed |= mandatory;
  std::vector<std::string> names = {"checkpoint policy"};
  if (allowed & kMicroBatch) names.push_back("micro-batch");
  if (allowed & kBf16) names.push_back("bf16");
  if (allowed & kOptim8bit) names.push_back("8-bit optimizer");
  if (allowed & kCompress) names.push_back("activation compression");
  if (allowed & kStage) names.push_back("ZeRO stage");
  if (allowed & kGradBf16) names.push_back("bf16 gradients");
  if (allowed & kNoMaster) names.push_back("no master weights");
  a.levers = fmt::format("{}", fmt::join(names, ", "));

  // Two passes (perf: a 70B run's advice planned 128 sets over the whole policy list, the
  // `layers:0..k-1` family 79 of its 97 policies, and was 99% of a `plan --auto` that found
  // nothing): every set over coarse_policies first, which decide whether a set fits (each of
  // the family keeps at least full's bytes: layout_search.h), then the sets that fit again over
  // every policy, for their fastest.
  std::vector<Tried> tried;
  const std::vector<std::string> coarse = coarse_policies(base.model.n_layer, base.attention);
  for (unsigned set = 0; set <= kAllLevers; ++set) {
    if ((set & allowed) != set || (set & mandatory) != mandatory) continue;
    const std::optional<RunSpec> c = lever_run(base, set);
    if (!c) continue;
    SearchResult r;
    try {
      r = search_training(*c, limit, lever_space(set, coarse));
      if (r.fits && (set & kPolicy)) r = search_training(*c, limit, lever_space(set, {}));
    } catch (const ConfigError&) {
      if (set == mandatory) throw;  // the run's own error
      continue;                     // a combination the engine refuses
    }
    Tried t;
    t.levers = set;
    t.fits = r.fits;
    t.fastest = option(spec, *c, r.choice);
    t.smallest = option(spec, *c, r.smallest);
    if (set == 0) {
      a.planned = r.choice.peak_bytes;
      a.fits_as_is = r.fits;
    }
    tried.push_back(std::move(t));
  }
  a.smallest = tried.front().smallest;
  for (const Tried& t : tried)
    if (t.smallest.plan.peak_bytes < a.smallest.plan.peak_bytes) a.smallest = t.smallest;
  if (a.fits_as_is) return a;
  for (const Tried& t : tried) {
    if (!t.fits) continue;
    // Worth naming: every fitting set of fewer changes is slower (more changes must buy time).
    const bool minimal = std::none_of(tried.begin(), tried.end(), [&](const Tried& u) {
      return u.fits && u.levers != t.levers && (u.levers & t.levers) == u.levers &&
             !faster(t.fastest.plan, u.fastest.plan);
    });
    const bool seen = std::any_of(a.options.begin(), a.options.end(),
                                  [&](const FitOption& o) { return o.change == t.fastest.change; });
    if (minimal && !seen) a.options.push_back(t.fastest);
  }
  std::stable_sort(a.options.begin(), a.options.end(), [](const FitOption& x, const FitOption& y) {
    return preferred(x.plan, y.plan);
  });
  return a;
}

std::string FitAdvice::text() const {
  if (fits_as_is)
    return fmt::format("the planner: the run as configured is planned at {}, which fits {}; "
                       "what ran out is not in its plan",
                       format_mib(planned), format_mib(limit));
  if (options.empty()) {
    const Candidate& s = smallest.plan;
    return fmt::format("the planner's advice: nothing fits {} whatever it changes ({}): the "
                       "smallest footprint is {} with {}, {} over; its largest part is {}, {}",
                       format_mib(limit), levers, format_mib(s.peak_bytes), smallest.change,
                       format_mib(s.over(limit)), category_name(s.dominant()),
                       format_mib(s.dominant_bytes()));
  }
  std::string out = fmt::format("the planner's advice: these fit {}{}:", format_mib(limit),
                                planned ? fmt::format(" (as configured: {})", format_mib(planned))
                                        : std::string());
  for (const FitOption& o : options)
    out += fmt::format("\n  peak {:>11}, about {:>6} s a step: {}", format_mib(o.plan.peak_bytes),
                       format_seconds(o.plan.est_step_seconds), o.change);
  return out;
}

OutOfMemoryError with_fit_advice(const OutOfMemoryError& e, const RunSpec& spec) {
  std::string advice;
  try {
    advice = advise_fit(spec, e.budget()).text();
  } catch (const Error& planner) {
    advice = fmt::format("(the planner could not advise: {})", planner.what());
  }
  OutOfMemoryError advised = e;
  advised.set_advice(std::move(advice));
  return advised;
}

}  // namespace memfit
