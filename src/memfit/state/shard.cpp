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

}  // namespace memfit
