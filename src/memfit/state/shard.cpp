// Shard and unit ranges of a parameter layout (Note [Model state]).
#include "memfit/state/shard.h"

#include <algorithm>

#include "memfit/core/error.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

std::vector<ElementRange> shard_ranges(const ParamLayout& layout, const OptimConfig& optim,
                                       int world) {
  MEMFIT_CHECK(world >= 1, "shard", "world size must be at least 1, got {}", world);
  // The whole-layout optimizer, without state, knows where its state can be cut.
  const std::unique_ptr<Optimizer> opt = make_optimizer(optim, layout, nullptr);
  const int64_t total = layout.total();
  std::vector<ElementRange> out;
  int64_t begin = 0;
  for (int r = 0; r < world; ++r) {
    int64_t end = total;
    if (r + 1 < world) {
      const int64_t ideal = static_cast<int64_t>((static_cast<__int128>(total) * (r + 1)) / world);
      end = std::max(begin, opt->next_cut(ideal));
    }
    out.push_back({begin, end});
    begin = end;
  }
  return out;
}

std::vector<ElementRange> unit_ranges(const ParamLayout& layout) {
  // The layout is layer-major (param_layout.h): embeddings (layer -1), blocks 0..L-1, then the
  // final norm and head (layer -1 again), so a unit starts wherever the layer changes.
  const auto& ps = layout.params();
  std::vector<ElementRange> out;
  int64_t begin = 0;
  for (size_t i = 1; i < ps.size(); ++i)
    if (ps[i].layer != ps[i - 1].layer) {
      out.push_back({begin, ps[i].offset});
      begin = ps[i].offset;
    }
  out.push_back({begin, layout.total()});
  return out;
}

ElementRange block_range(const ParamLayout& layout, int layer) {
  const std::vector<ElementRange> units = unit_ranges(layout);
  MEMFIT_CHECK(layer >= 0 && layer + 2 < static_cast<int>(units.size()), "shard",
               "block {} is not in a model of {} blocks", layer, static_cast<int>(units.size()) - 2);
  return units[static_cast<size_t>(layer) + 1];
}

}  // namespace memfit
