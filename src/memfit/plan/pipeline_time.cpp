// A pipelined step's time and the balanced cut; see pipeline_time.h and Note [Pipeline
// parallel], "The step's time".
#include "memfit/plan/pipeline_time.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/dist/pipeline_runner.h"
#include "memfit/dist/process_grid.h"
#include "memfit/memory/pool.h"
#include "memfit/model/pipeline_interleaved.h"

namespace memfit {

double PipelineTime::stage_step(int s) const {
  const auto i = static_cast<size_t>(s);
  return slots() * (compute[i] + p2p[i]) / virtual_stages + once[i];
}

namespace {

// Stage s's transfers a micro-batch, priced where the runner waits for them: on the receiver
// (dist/pipeline_runner.cpp: a send is MPI_Isend, waited only when its buffer is reused, long
// after it has arrived; a receive is blocking, posted when the operation that reads it starts;
// on one host OpenMPI's shared-memory transport copies a large message when the receiver
// matches it, and across nodes nothing progresses it while the receiver computes either). It
// receives its input from stage s - 1 (on cut s - 1) and its output's gradient from stage
// s + 1 (on cut s), one message each; with V chunks, V of each, the first stage's input from
// the last over the wrap `cuts[P - 1]` for chunks 1 .. V - 1 and the last stage's gradients
// from the first over it for chunks 0 .. V - 2. The counts and links are the same as a stage's
// sends (its output on cut s, its input's gradient on cut s - 1): which side pays changes the
// reasoning, not the numbers.
double stage_receives(int s, int P, int V, int64_t boundary, const std::vector<Link>& cuts,
                      const Calibration& rates) {
  auto on = [&](int cut, int messages) {
    return messages * link_seconds(cuts[static_cast<size_t>(cut)], double(boundary), 1, rates);
  };
  double t = 0;
  if (s > 0) t += on(s - 1, V);                       // inputs: chunk c from stage s - 1
  else if (V > 1) t += on(P - 1, V - 1);              // chunks 1 .. V - 1 from the last stage
  if (s + 1 < P) t += on(s, V);                       // gradients from stage s + 1
  else if (V > 1) t += on(P - 1, V - 1);              // chunks 0 .. V - 2 from the first stage
  return t;
}

// Each cut's link between the stages' ranks (spec.links), and whether it is the inter link.
std::pair<std::vector<Link>, std::vector<bool>> cut_links(const RunSpec& spec) {
  const dist::GridShape grid{spec.world, spec.pp(), spec.model.tp};
  std::vector<Link> cuts;
  std::vector<bool> inter;
  for (int s = 0; s + 1 < spec.pp(); ++s) {
    const Link& l = spec.links.stage_link(grid, s);
    cuts.push_back(l);
    inter.push_back(&l == &spec.links.inter);
  }
  return {cuts, inter};
}

// Interleaved: the wrap from the last stage to the first appended as cut P - 1. A pipeline
// group's ranks increase with the stage, so its ends lie on two nodes exactly where some cut
// between them does.
void add_wrap(std::vector<Link>& cuts, std::vector<bool>& inter) {
  const auto any = std::find(inter.begin(), inter.end(), true);
  cuts.push_back(any != inter.end() ? cuts[static_cast<size_t>(any - inter.begin())]
                                    : cuts.front());
  inter.push_back(any != inter.end());
}

// Interleaved: virtual stage v's transfers a micro-batch (of N = P x V), priced on its receiver
// as stage_receives does: its input from v - 1 and its output's gradient from v + 1, each on
// the cut between their ranks (rank v mod P; between rank P - 1 and rank 0 the wrap, cut P - 1
// of `cuts` with add_wrap's).
double chunk_receives(int v, int P, int N, int64_t boundary, const std::vector<Link>& cuts,
                      const Calibration& rates) {
  auto on = [&](int cut) {
    return link_seconds(cuts[static_cast<size_t>(cut)], double(boundary), 1, rates);
  };
  double t = 0;
  if (v > 0) t += on((v - 1) % P);
  if (v + 1 < N) t += on(v % P);
  return t;
}

// What each rank sends across a cut per micro-batch, as the runner sizes it (under --tp each
// tensor rank its own copy; with --sp its rows alone).
int64_t boundary_bytes(const RunSpec& spec) {
  return dist::pipeline_boundary_floats(spec.model, spec.activation_options(), spec.batch,
                                        spec.T) *
         int64_t{sizeof(float)};
}

}  // namespace

PipelineTime pipeline_time(const std::vector<StepTime>& stages, int micro_batches,
                           int64_t boundary_bytes, const std::vector<Link>& cuts_in,
                           const std::vector<bool>& inter_in, const Calibration& rates,
                           int virtual_stages) {
  const int P = static_cast<int>(stages.size()), V = virtual_stages;
  MEMFIT_CHECK(P >= 1 && micro_batches >= 1 && V >= 1 && cuts_in.size() + 1 == stages.size() &&
                   inter_in.size() == cuts_in.size(),
               "pipeline", "{} stages, {} micro-batches, {} chunks a stage and {} cuts", P,
               micro_batches, V, cuts_in.size());
  if (V > 1) check_interleaved(P, V, micro_batches);
  std::vector<Link> cuts = cuts_in;
  std::vector<bool> inter = inter_in;
  if (V > 1) add_wrap(cuts, inter);
  PipelineTime t;
  t.stages = P;
  t.micro_batches = micro_batches;
  t.virtual_stages = V;
  t.p2p_bytes = P > 1 ? boundary_bytes : 0;
  t.cut_inter = inter;
  for (int s = 0; s < P; ++s) {
    const StepTime& st = stages[static_cast<size_t>(s)];
    t.compute.push_back(st.micro_batches() / micro_batches);
    t.p2p.push_back(P > 1 ? stage_receives(s, P, V, boundary_bytes, cuts, rates) : 0.0);
    t.once.push_back(st.total() - st.micro_batches());
    const double slot = (t.compute.back() + t.p2p.back()) / V;
    if (slot > t.slot) {
      t.slot = slot;
      t.slowest = s;
    }
    t.once_most = std::max(t.once_most, t.once.back());
  }
  t.step = t.slots() * t.slot + t.once_most;
  return t;
}

PipelineTime plan_pipeline_time(const RunSpec& spec, const std::vector<PlanReport>& stages,
                                const Calibration& rates, int virtual_stages) {
  std::vector<StepTime> times;
  for (const PlanReport& r : stages) times.push_back(r.step_time);
  const auto [cuts, inter] = cut_links(spec);
  return pipeline_time(times, spec.grad_accum, boundary_bytes(spec), cuts, inter, rates,
                       virtual_stages);
}

namespace {

// One planned stage: its estimate and its peak, with the kept inputs and transfer buffers of
// the index it was planned at (to be swapped for another index's).
struct Probe {
  StepTime time;
  int64_t peak = 0, pipe = 0;
};

// The cheapest contiguous cut of n_layer blocks into P stages under `cost(s, first, last)`:
// the least largest stage cost (ties: the least sum of squares), cutting only where `allowed`.
template <typename Cost>
std::vector<int> least_largest(int P, int L, const std::vector<bool>& allowed, Cost cost) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  using Score = std::pair<double, double>;  // the largest, the sum of squares
  std::vector<std::vector<Score>> best(static_cast<size_t>(P),
                                       std::vector<Score>(static_cast<size_t>(L) + 1, {kInf, kInf}));
  std::vector<std::vector<int>> from(static_cast<size_t>(P),
                                     std::vector<int>(static_cast<size_t>(L) + 1, -1));
  auto ok = [&](int j) { return j == L || allowed[static_cast<size_t>(j)]; };
  for (int j = 1; j <= L - (P - 1); ++j)
    if (ok(j) && j < L) {
      const double c = cost(0, 0, j);
      best[0][static_cast<size_t>(j)] = {c, c * c};
    }
  for (int s = 1; s < P; ++s)
    for (int j = s + 1; j <= L - (P - 1 - s); ++j) {
      if (!ok(j) || (s + 1 < P && j == L) || (s + 1 == P && j != L)) continue;
      for (int i = s; i < j; ++i) {
        const Score& before = best[static_cast<size_t>(s - 1)][static_cast<size_t>(i)];
        if (before.first == kInf) continue;
        const double c = cost(s, i, j);
        const Score score{std::max(before.first, c), before.second + c * c};
        if (score < best[static_cast<size_t>(s)][static_cast<size_t>(j)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(j)] = score;
          from[static_cast<size_t>(s)][static_cast<size_t>(j)] = i;
        }
      }
    }
  std::vector<int> counts(static_cast<size_t>(P));
  int j = L;
  for (int s = P - 1; s > 0; --s) {
    const int i = from[static_cast<size_t>(s)][static_cast<size_t>(j)];
    if (i < 0)
      MEMFIT_THROW(ConfigError, "pp-layers",
                   "--pp-layers auto: no cut of {} blocks into {} stages lies between the "
                   "--ckpt segments (give --pp-layers)",
                   L, P);
    counts[static_cast<size_t>(s)] = j - i;
    j = i;
  }
  counts[0] = j;
  return counts;
}

}  // namespace

StageSplit balance_stages(const RunSpec& spec) {
  // Under --pp-schedule interleaved the pieces are the P x V chunks, each balanced as a stage
  // of its own (Note [Pipeline parallel], "Interleaved": "--pp-layers auto").
  const int P = spec.pp(), V = spec.pipe_virtual, N = P * V, L = spec.model.n_layer,
            m = spec.grad_accum;
  MEMFIT_CHECK(P > 1, "pp-layers", "a balanced cut of one stage");
  const Calibration& rates = machine_calibration();
  // Cut only between checkpoint segments: each stage recomputes from inputs it holds.
  const std::vector<std::pair<int, int>> segments = spec.ckpt.segments(L);
  std::vector<bool> allowed(static_cast<size_t>(L) + 1, true);
  for (const auto& [a, b] : segments)
    for (int c = a + 1; c <= b; ++c) allowed[static_cast<size_t>(c)] = false;
  std::vector<Link> cuts;  // (lambdas capture no structured bindings)
  std::vector<bool> inter;
  std::tie(cuts, inter) = cut_links(spec);
  if (V > 1) add_wrap(cuts, inter);
  const int64_t boundary = boundary_bytes(spec);
  // A stage's kept inputs and transfer buffers (1F1B, GPipe); an interleaved chunk's plan has
  // none (they are its rank's, over its chunks: plan/interleaved_plan.h).
  auto pipe_bytes = [&](int index) -> int64_t {
    if (V > 1) return 0;
    const dist::PipelineBuffers b =
        dist::pipeline_buffers(spec.pipe_schedule, index, P, m, boundary);
    return b.activations + b.comm;
  };

  // Plans by kind of piece (0 first, 1 middle, 2 last), block count and the segments within
  // (relative to the piece's first block).
  using Key = std::tuple<int, int, std::vector<std::pair<int, int>>>;
  std::map<Key, Probe> probes;
  auto probe = [&](int s, int i, int j) -> const Probe& {
    const int kind = s == 0 ? 0 : s == N - 1 ? 2 : 1;
    std::vector<std::pair<int, int>> within;
    for (const auto& [a, b] : segments)
      if (a >= i && b < j) within.emplace_back(a - i, b - i);
    Key key{kind, j - i, std::move(within)};
    const auto found = probes.find(key);
    if (found != probes.end()) return found->second;
    const int index = kind == 0 ? 0 : kind == 2 ? N - 1 : 1;
    RunSpec run = spec;
    run.model.set_pipeline_stage({index, N, i, j});
    const PlanReport r = plan_training(run);
    Probe p{r.step_time, static_cast<int64_t>(r.peak_bytes), pipe_bytes(index)};
    return probes.emplace(std::move(key), p).first->second;
  };
  // A piece's step as if the whole pipeline ran at its pace: 1F1B's m + p - 1 slots of a
  // stage's micro-batch, interleaved's m V + p - 1 of a chunk's (pipeline_time).
  auto stage_step = [&](int s, int i, int j) {
    const StepTime& t = probe(s, i, j).time;
    const double receives = V > 1 ? chunk_receives(s, P, N, boundary, cuts, rates)
                                  : stage_receives(s, P, 1, boundary, cuts, rates);
    return (m * V + P - 1) * (t.micro_batches() / m + receives) + (t.total() - t.micro_batches());
  };
  auto stage_peak = [&](int s, int i, int j) {
    const Probe& p = probe(s, i, j);
    return double(p.peak - p.pipe + pipe_bytes(s));
  };
  auto largest = [&](const std::vector<int>& counts, auto cost) {
    double most = 0;
    int at = 0, first = 0;
    for (int s = 0; s < N; ++s) {
      const int last = first + counts[static_cast<size_t>(s)];
      const double c = cost(s, first, last);
      if (c > most) most = c, at = s;
      first = last;
    }
    return std::pair{most, at};
  };

  StageSplit out;
  const std::vector<int> by_time = least_largest(N, L, allowed, stage_step);
  out.stages = stages_from_counts(by_time);
  const auto [slowest, slowest_at] = largest(by_time, stage_step);
  out.why = fmt::format("--pp-layers auto: blocks {}, the cut whose slowest {}'s estimated "
                        "step is least ({} {}, {:.3g} s)",
                        describe_stages(out.stages), V > 1 ? "chunk" : "stage",
                        V > 1 ? "virtual stage" : "stage", slowest_at, slowest);
  // (Interleaved: a rank's bytes are its V chunks' together, which no contiguous cut of one
  // piece prices; the plan says per rank whether it fits.)
  if (spec.mem_limit == 0 || V > 1) return out;
  const auto [peak, peak_at] = largest(by_time, stage_peak);
  if (peak <= double(spec.mem_limit)) return out;
  const std::vector<int> by_bytes = least_largest(P, L, allowed, stage_peak);
  const std::vector<PipelineStage> time_cut = out.stages;
  out.stages = stages_from_counts(by_bytes);
  out.by_memory = true;
  const double least = largest(by_bytes, stage_peak).first;
  out.why = fmt::format(
      "--pp-layers auto: blocks {}, the cut whose largest stage's peak is least ({}), since "
      "the time-balanced cut {} needs {} on stage {}, over --mem-limit {}",
      describe_stages(out.stages), format_mib(static_cast<size_t>(least)),
      describe_stages(time_cut), format_mib(static_cast<size_t>(peak)), peak_at,
      format_mib(spec.mem_limit));
  return out;
}

}  // namespace memfit
