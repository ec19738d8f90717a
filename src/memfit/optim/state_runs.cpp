// A rank's optimizer state in the whole model's: see state_runs.h.
#include "memfit/optim/state_runs.h"

#include <algorithm>
#include <memory>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/model/layout_map.h"
#include "memfit/optim/adamw4bit.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

namespace {

// A layout run inside one parameter of each layout: local element a of parameter lp, whole
// element w of parameter wp, n elements.
struct ParamRun {
  size_t lp, wp;
  int64_t a, w, n;
};

// The parameter of `layout` that holds element x; params().size() if none.
size_t param_holding(const ParamLayout& layout, int64_t x) {
  const auto& ps = layout.params();
  auto it = std::partition_point(ps.begin(), ps.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= x; });
  if (it == ps.end() || it->offset > x) return ps.size();
  return static_cast<size_t>(it - ps.begin());
}

std::vector<ParamRun> param_runs(const ParamLayout& mine, const ParamLayout& whole,
                                 const std::vector<SliceRun>& runs) {
  std::vector<ParamRun> out;
  for (const SliceRun& r : runs) {
    if (r.whole < 0) continue;
    int64_t a = r.local, w = r.whole, n = r.n;
    while (n > 0) {
      const size_t lp = param_holding(mine, a), wp = param_holding(whole, w);
      MEMFIT_CHECK(lp < mine.params().size() && wp < whole.params().size(), "checkpoint",
                   "layout run ({}, {}, {}) is not inside parameters of both layouts", a, w, n);
      const ParamInfo &p = mine.params()[lp], &q = whole.params()[wp];
      const int64_t k = std::min({n, p.offset + p.numel - a, q.offset + q.numel - w});
      out.push_back({lp, wp, a, w, k});
      a += k, w += k, n -= k;
    }
  }
  return out;
}

void append(std::vector<SliceRun>& runs, SliceRun r) {
  if (r.n <= 0) return;
  if (!runs.empty() && runs.back().local + runs.back().n == r.local &&
      runs.back().whole + runs.back().n == r.whole) {
    runs.back().n += r.n;
    return;
  }
  runs.push_back(r);
}

// 4-bit AdamW's rank-1 maxima of one matrix: the rank's rows (or row) map to the whole matrix's
// rows, its columns to the whole's columns; each (local, whole, n) once.
void rank1_runs(const ParamRun& r, const ParamInfo& p, const ParamInfo& q, int64_t at_local,
                int64_t at_whole, std::set<std::tuple<int64_t, int64_t, int64_t>>& out) {
  const int64_t cl = p.shape[1], cw = q.shape[1];
  const int64_t i0 = (r.a - p.offset) / cl, j0 = (r.a - p.offset) % cl;
  const int64_t I0 = (r.w - q.offset) / cw, J0 = (r.w - q.offset) % cw;
  if (j0 == 0 && J0 == 0 && cl == cw && r.n % cl == 0) {  // whole rows
    out.insert({at_local + i0, at_whole + I0, r.n / cl});
    out.insert({at_local + p.shape[0], at_whole + q.shape[0], cl});
    return;
  }
  MEMFIT_CHECK(j0 + r.n <= cl && J0 + r.n <= cw, "checkpoint",
               "{}: a run of {} elements from ({}, {}) crosses a row: its rank-1 maxima do not "
               "map onto the whole matrix's",
               p.name, r.n, i0, j0);
  out.insert({at_local + i0, at_whole + I0, 1});
  out.insert({at_local + p.shape[0] + j0, at_whole + q.shape[0] + J0, r.n});
}

}  // namespace

std::vector<std::vector<SliceRun>> state_layout_runs(const Optimizer& mine, const Optimizer& whole,
                                                     const std::vector<SliceRun>& runs,
                                                     StateRunUse use) {
  const std::vector<StateSpec>& specs = mine.whole_state_specs();
  const std::vector<StateSpec>& wspecs = whole.whole_state_specs();
  MEMFIT_CHECK(mine.name() == whole.name() && specs.size() == wspecs.size(), "checkpoint",
               "'{}' with {} state tensors against '{}' with {}", mine.name(), specs.size(),
               whole.name(), wspecs.size());
  const ParamLayout &ml = mine.layout(), &wl = whole.layout();
  const std::vector<ParamRun> pruns = param_runs(ml, wl, runs);
  // 4-bit AdamW's second moment: rank-1 maxima of its matrices (quantized_state.h).
  std::unique_ptr<QuantizedStateLayout> mq, wq;
  if (mine.name() == "adamw4bit") {
    mq = std::make_unique<QuantizedStateLayout>(ml, AdamW4bit::second_moment_format());
    wq = std::make_unique<QuantizedStateLayout>(wl, AdamW4bit::second_moment_format());
  }
  std::vector<std::vector<SliceRun>> out(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    MEMFIT_CHECK(specs[i].name == wspecs[i].name, "checkpoint", "state '{}' against '{}'",
                 specs[i].name, wspecs[i].name);
    const bool rowcol = mq && specs[i].name == "v.rowcol";
    const bool shared_rows = mine.name() == "adam-mini" && specs[i].name == "v";
    std::set<std::tuple<int64_t, int64_t, int64_t>> rank1;
    for (const ParamRun& r : pruns) {
      const ParamInfo &p = ml.params()[r.lp], &q = wl.params()[r.wp];
      const ElementRange l = mine.state_extents({r.a, r.a + r.n})[i];
      const ElementRange w = whole.state_extents({r.w, r.w + r.n})[i];
      if (rowcol && mq->slot(r.lp).rank1) {
        MEMFIT_CHECK(wq->slot(r.wp).rank1, "checkpoint",
                     "{} has rank-1 4-bit state on the rank, not in the whole model", p.name);
        rank1_runs(r, p, q, mq->slot(r.lp).scale, wq->slot(r.wp).scale, rank1);
        continue;
      }
      if (l.size() == w.size()) {
        append(out[i], {l.begin, w.begin, l.size()});
        continue;
      }
      // Adam-mini's v of a row-parallel row: the rank holds part of the row, and the whole row's
      // v (summed over the tensor group). The rank with the row's first column saves it.
      if (shared_rows && w.size() == 0 && l.size() >= 1 && w.begin > 0) {
        if (use == StateRunUse::load) append(out[i], {l.begin, w.begin - 1, 1});
        continue;
      }
      // A run that ends its tensor on one side: that side's rest is alignment (a tensor's codes
      // padded to a whole block, a slab rounded up to 64 bytes), never another tensor's state.
      const bool ends_local = r.a + r.n == p.offset + p.numel;
      const bool ends_whole = r.w + r.n == q.offset + q.numel;
      if ((l.size() > w.size() && ends_local) || (w.size() > l.size() && ends_whole)) {
        append(out[i], {l.begin, w.begin, std::min(l.size(), w.size())});
        continue;
      }
      MEMFIT_THROW(Error, "checkpoint",
                   "'{}' state '{}' of {}: the rank's elements [{}, {}) of {} {} are the whole "
                   "tensor's [{}, {}) of {}, whose state is {} values on the rank and {} in the "
                   "whole model (quantisation blocks cut otherwise)",
                   mine.name(), specs[i].name, p.name, r.a - p.offset, r.a - p.offset + r.n,
                   p.name, p.shape, r.w - q.offset, r.w - q.offset + r.n, q.shape, l.size(),
                   w.size());
    }
    for (const auto& [a, w, n] : rank1) append(out[i], {a, w, n});
  }
  return out;
}

std::optional<std::string> layout_state_refusal(const OptimConfig& optim,
                                                const ModelConfig& config) {
  const ParamLayout mine(config), whole(whole_run_model(config));
  const auto mo = make_optimizer(optim, mine, nullptr, ElementRange{0, 0});
  const auto wo = make_optimizer(optim, whole, nullptr, ElementRange{0, 0});
  try {
    for (int t = 0; t < config.tp; ++t) {
      const std::vector<SliceRun> runs = whole_layout_runs(config, t);
      state_layout_runs(*mo, *wo, runs, StateRunUse::load);
      state_layout_runs(*mo, *wo, first_holder_runs(config, t), StateRunUse::save);
    }
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace memfit
