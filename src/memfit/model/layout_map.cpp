// The layout map: a rank's parameter layout in the whole model's. See layout_map.h.
#include "memfit/model/layout_map.h"

#include <algorithm>

#include "memfit/model/param_layout.h"
#include "memfit/model/stage_offsets.h"

namespace memfit {

ModelConfig whole_run_model(const ModelConfig& config) {
  ModelConfig c = whole_model(config);
  c.set_pipeline_stage({});
  return c;
}

namespace {

bool holds(const ElementRange& range, int64_t at) { return range.begin <= at && at < range.end; }

}  // namespace

bool layout_split(const ModelConfig& config) { return config.tp > 1 || config.pipelined(); }

std::vector<SliceRun> whole_layout_runs(const ModelConfig& config, int rank) {
  // The slices map the rank's layout into the whole stage's (tp 1, the same stage), whose
  // element 0 is whole_offset() of the whole model's; a tied last stage's copy of the token
  // table (after its final norm) is the table's elements, which start the whole layout
  // (Note [Pipeline parallel], "Tied embeddings"). tensor_slice_runs cuts runs per parameter,
  // so no run straddles the copy's start.
  const ParamLayout stage(whole_model(config));
  const ElementRange copy = tied_table_copy(stage);
  std::vector<SliceRun> runs = tensor_slice_runs(config, rank);
  for (SliceRun& r : runs)
    if (r.whole >= 0) r.whole += holds(copy, r.whole) ? -copy.begin : stage.whole_offset();
  return runs;
}

namespace {

// Sorted, disjoint whole ranges: the union of `runs`' whole elements.
std::vector<ElementRange> whole_union(std::vector<ElementRange> parts) {
  std::sort(parts.begin(), parts.end(),
            [](const ElementRange& a, const ElementRange& b) { return a.begin < b.begin; });
  std::vector<ElementRange> out;
  for (const ElementRange& p : parts) {
    if (p.empty()) continue;
    if (!out.empty() && p.begin <= out.back().end) out.back().end = std::max(out.back().end, p.end);
    else out.push_back(p);
  }
  return out;
}

}  // namespace

std::vector<SliceRun> first_holder_runs(const ModelConfig& config, int rank) {
  // A tied last stage's copy of the table is the first stage's table, which that stage writes.
  const ElementRange copy = tied_table_copy(ParamLayout(config));
  std::vector<ElementRange> lower;
  for (int q = 0; q < rank; ++q)
    for (const SliceRun& r : whole_layout_runs(config, q))
      if (r.whole >= 0) lower.push_back({r.whole, r.whole + r.n});
  const std::vector<ElementRange> held = whole_union(std::move(lower));
  std::vector<SliceRun> out;
  for (const SliceRun& r : whole_layout_runs(config, rank)) {
    if (r.whole < 0 || holds(copy, r.local)) continue;
    // The parts of [r.whole, r.whole + n) outside every lower rank's ranges.
    int64_t a = r.whole;
    const int64_t end = r.whole + r.n;
    auto it = std::upper_bound(held.begin(), held.end(), a,
                               [](int64_t x, const ElementRange& h) { return x < h.end; });
    while (a < end) {
      const int64_t next = it == held.end() ? end : std::min(end, it->begin);
      if (a < next) out.push_back({r.local + (a - r.whole), a, next - a});
      if (it == held.end() || it->begin >= end) break;
      a = std::max(a, it->end);
      ++it;
    }
  }
  return out;
}

std::vector<SliceRun> runs_within(const std::vector<SliceRun>& runs, ElementRange range) {
  std::vector<SliceRun> out;
  for (const SliceRun& r : runs) {
    if (r.whole < 0) continue;
    const ElementRange part = range.intersect({r.local, r.local + r.n});
    if (part.empty()) continue;
    out.push_back({part.begin, r.whole + (part.begin - r.local), part.size()});
  }
  return out;
}

}  // namespace memfit
