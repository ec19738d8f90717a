// The layout search: every tp x pp x dp split of the ranks, each searched as search_training
// searches one layout; see layout_search.h and Note [Fit a budget], "Layouts".
#include "memfit/plan/layout_search.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/memory/pool.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/plan/memory_plan.h"

namespace memfit {

namespace {

// One layout tried: its shape, and why it was not searched (empty: searched).
struct Tried {
  int tp = 1, pp = 1, dp = 1;
  bool sp = false;
  std::string skipped{};
  std::string label() const {
    return fmt::format("tp {}{} x pp {} x dp {}", tp, sp ? " --sp" : "", pp, dp);
  }
};

bool same_layout(const Candidate& c, const Tried& t) {
  return c.tp == t.tp && c.pp == t.pp && c.sp == t.sp;
}

// The run's check of `run` as a candidate makes it (the search's "auto"s resolved), with no
// policy: whether the layout itself is accepted.
void check_layout(const RunSpec& run) {
  RunSpec probe = run;
  probe.ckpt = CheckpointPolicy{};
  probe.ckpt_auto = probe.auto_batch = probe.zero_auto = false;
  probe.check();
}

// The least model state (params, master, grads, optimizer) a candidate of `run` can hold on
// some rank: its most frugal candidate's (full recomputation, the smallest micro-batch, the
// highest ZeRO stage and the most precision levers the run accepts), on world rank 0 of each
// stage, the largest of them, and that stage. Every candidate's state on that rank is at least
// this (each category only shrinks with the stage and the levers; a slab of gradients in the
// activations arena is the whole gradient, more than any shard), so its peak is too. -1 when
// the run accepts no frugal candidate (nothing to bound: search it).
std::pair<int64_t, int> least_model_state(const RunSpec& run, const SearchSpace& space) {
  Candidate f;
  f.ckpt = "full";
  f.batch = space.micro_batches ? 1 : run.batch;
  f.grad_accum = run.batch * run.grad_accum / f.batch;
  const bool levers = run.precision_levers_open && run.precision.precision == Precision::bf16;
  for (int zero : space.stages ? std::vector<int>{3, 2, 1, 0} : std::vector<int>{run.zero})
    for (int lever = levers ? kPrecisionLevers : 0; lever >= 0; --lever) {
      f.zero = zero;
      f.levers = lever;
      const RunSpec t = apply_candidate(run, f);
      try {
        t.check();
      } catch (const ConfigError&) {
        continue;
      }
      int64_t most = 0;
      int at = 0;
      for (int s = 0; s < t.pp(); ++s) {
        const PlanReport p = plan_memory(t.stage(s), 0);
        int64_t state = 0;
        for (Category c : {Category::params, Category::master, Category::grads,
                           Category::optimizer})
          state += static_cast<int64_t>(p.by_category[static_cast<size_t>(c)]);
        if (state > most) most = state, at = s;
      }
      return {most, at};
    }
  return {-1, 0};
}

// The line of one layout for the result's table of layouts.
std::string layout_line(const SearchResult& r, const Tried& t) {
  if (!t.skipped.empty()) return fmt::format("{}: {}", t.label(), t.skipped);
  const Candidate* best = nullptr;
  const Candidate* least = nullptr;
  for (const Candidate& c : r.candidates) {
    if (!same_layout(c, t)) continue;
    if (c.fits && (!best || preferred(c, *best))) best = &c;
    if (!least || c.peak_bytes < least->peak_bytes) least = &c;
  }
  if (!least) return fmt::format("{}: no configuration planned", t.label());
  if (r.fits && same_layout(r.choice, t))
    return fmt::format("{}: chosen, {} a rank at most, about {} s a step", t.label(),
                       format_mib(r.choice.peak_bytes), format_seconds(r.choice.est_step_seconds));
  if (best)
    return fmt::format("{}: fits ({} a rank at most with {}), but about {} s a step{}",
                       t.label(), format_mib(best->peak_bytes),
                       candidate_options(*best, false, r.with_stage),
                       format_seconds(best->est_step_seconds),
                       best->levers > r.choice.levers ? " with more precision levers pulled"
                       : faster(r.choice, *best)      ? ", slower"
                                                      : ", as fast, the more complex layout");
  return fmt::format("{}: nothing fits, the smallest {} a rank ({}), {} over", t.label(),
                     format_mib(least->peak_bytes),
                     candidate_options(*least, false, r.with_stage),
                     format_mib(least->over(r.limit)));
}

}  // namespace

std::vector<int> tensor_candidates(int ranks, int ranks_per_node) {
  const int cap = ranks_per_node > 0 ? ranks_per_node : kDefaultTensorRanksCap;
  std::vector<int> out;
  for (int t = 1; t <= std::min(ranks, cap); ++t)
    if (ranks % t == 0) out.push_back(t);
  return out;
}

std::vector<int> pipeline_candidates(int ranks, int n_layer) {
  std::vector<int> out;
  for (int p = 1; p <= std::min(ranks, n_layer); ++p)
    if (ranks % p == 0) out.push_back(p);
  return out;
}

std::vector<std::string> coarse_policies(int n_layer, AttentionKind attention) {
  std::vector<std::string> out;
  for (std::string& p : checkpoint_candidates(n_layer, attention))
    if (p.rfind("layers:", 0) != 0) out.push_back(std::move(p));
  return out;
}

SearchResult search_layouts(
    const RunSpec& base, size_t limit, SearchSpace space,
    const std::function<void(const std::string& layout, int index, int count)>& progress) {
  MEMFIT_CHECK(base.model.tp == 1 && base.pp() == 1, "plan",
               "the layout search starts from one tensor rank and one stage (got tp {}, pp {})",
               base.model.tp, base.pp());
  const int N = base.world;
  std::vector<std::pair<int, int>> shapes;  // (tp, pp), the simpler first
  for (int tp : tensor_candidates(N, base.links.ranks_per_node))
    for (int pp : pipeline_candidates(N / tp, base.model.n_layer)) shapes.emplace_back(tp, pp);
  std::stable_sort(shapes.begin(), shapes.end(), [](auto a, auto b) {
    return std::pair(a.first * a.second, a.second) < std::pair(b.first * b.second, b.second);
  });
  const std::vector<std::string> coarse = coarse_policies(base.model.n_layer, base.attention);

  SearchResult all;
  all.limit = limit;
  all.disk_limit = base.offload.disk_limit;
  all.with_batch = true;  // the micro-batches a step follow the layout
  all.with_stage = space.stages;
  all.per_rank = N > 1;
  all.with_layout = true;
  all.world = N;
  std::vector<Tried> tried;
  // One layout's search, its candidates stamped with the layout and added to `all`.
  auto search = [&](const RunSpec& run, const Tried& t, SearchSpace s) {
    s.stages = space.stages && run.world > 1;
    SearchResult one = search_training(run, limit, s);
    for (Candidate& c : one.candidates) {
      c.tp = t.tp;
      c.pp = t.pp;
      c.sp = t.sp;
      all.candidates.push_back(std::move(c));
    }
  };
  int index = 0;
  for (const auto& [tp, pp] : shapes) {
    ++index;
    Tried t{tp, pp, N / (tp * pp)};
    RunSpec run;
    try {
      // --sp where the run accepts it: it divides the element-wise regions' activations by tp
      // and replaces each all-reduce by a reduce-scatter and an all-gather of the same bytes.
      t.sp = tp > 1;
      try {
        run = layout_run(base, tp, pp, t.sp);
        check_layout(run);
      } catch (const ConfigError&) {
        if (!t.sp) throw;
        t.sp = false;
        run = layout_run(base, tp, pp, false);
        check_layout(run);
      }
    } catch (const ConfigError& e) {
      t.skipped = fmt::format("refused: {}", e.what());
      tried.push_back(std::move(t));
      continue;
    }
    if (tp * pp > 1) {
      const auto [state, stage] = least_model_state(run, space);
      if (state >= 0 && static_cast<size_t>(state) > limit) {
        t.skipped = fmt::format("skipped: its model state alone is at least {} on stage {}'s "
                                "first rank, over the budget",
                                format_mib(static_cast<size_t>(state)), stage);
        tried.push_back(std::move(t));
        continue;
      }
    }
    if (progress) progress(t.label(), index, static_cast<int>(shapes.size()));
    SearchSpace s = space;
    if (space.policies) s.policy_list = coarse;
    try {
      search(run, t, s);
    } catch (const ConfigError& e) {
      t.skipped = fmt::format("refused: {}", e.what());
    }
    tried.push_back(std::move(t));
  }
  if (all.candidates.empty()) {
    std::string why;
    for (const Tried& t : tried) why += fmt::format("; {}: {}", t.label(), t.skipped);
    MEMFIT_THROW(ConfigError, "plan", "no layout of {} ranks could be planned{}", N, why);
  }
  choose_candidates(all);

  // The second pass: the chosen layout's remaining policies (the layers:0..k-1 family), at the
  // chosen precision levers. Where nothing fits, none of them would (coarse_policies).
  if (all.fits && space.policies) {
    const Candidate& c = all.choice;
    // Under a pipeline, the first k blocks where k ends a stage of the even cut (whole stages
    // recomputed: the first stages hold the most micro-batches in flight under 1F1B); each k
    // costs a plan of every stage, and these are the cuts the balance can keep.
    std::vector<int> ends;
    if (c.pp > 1)
      for (const PipelineStage& st : split_stages_evenly(base.model.n_layer, c.pp))
        ends.push_back(st.last);
    std::vector<std::string> rest;
    for (std::string& p : checkpoint_candidates(base.model.n_layer, base.attention)) {
      if (std::find(coarse.begin(), coarse.end(), p) != coarse.end()) continue;
      const CheckpointPolicy policy = CheckpointPolicy::parse(p);
      const int k = static_cast<int>(policy.layers.size());  // layers:0..k-1
      if (c.pp > 1 && std::find(ends.begin(), ends.end(), k) == ends.end()) continue;
      rest.push_back(p);
    }
    if (!rest.empty()) {
      const Tried t{c.tp, c.pp, N / (c.tp * c.pp), c.sp};
      RunSpec run = layout_run(base, c.tp, c.pp, c.sp);
      if (c.levers & kLeverGradBf16) run.grad_dtype = DType::bf16;
      if (c.levers & kLeverNoMaster) run.precision.master_weights = false;
      run.precision_levers_open = false;
      SearchSpace s = space;
      s.policy_list = rest;
      const size_t before = all.candidates.size();
      try {
        search(run, t, s);
      } catch (const ConfigError&) {
        // every one of them refused (e.g. segments across the cut): the first pass stands
      }
      for (size_t i = before; i < all.candidates.size(); ++i) all.candidates[i].levers = c.levers;
      choose_candidates(all);
    }
  }

  for (const Tried& t : tried) all.layouts.push_back(layout_line(all, t));
  all.layouts.push_back(
      "(the step times are the planner's model, not a measurement: each rank's compute from "
      "this host's calibration, the collectives and pipeline transfers priced on the links "
      "(--link, --ranks-per-node), the pipeline's bubble (p - 1)/m)");
  return all;
}

}  // namespace memfit
