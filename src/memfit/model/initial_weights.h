// The family's initial weights (Transformer::init_weights), drawn for any range of the layout:
// a rank draws its shard (or a piece of it) without the whole layout in memory, and gets the
// bits the whole draw gives those elements (Note [Initial weights by range] in
// docs/notes/zero.md).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/core/element_range.h"

namespace memfit {

// The initial weights drawn from `seed`: normal(0, 0.02) weights (GPT-2's residual projections
// scaled by 1/sqrt(2 n_layer)), norm gains 1, biases, padded vocabulary rows and alignment
// gaps 0. draw() gives any range the bits the whole layout drawn at once gives it; ranges
// drawn in increasing order cost the generator's walk once (an earlier range restarts it).
// A range is drawn by the OpenMP team, each thread a contiguous part with a generator of its
// own that skips to the part's position: the same bits whatever the thread count.
class InitialWeights {
 public:
  InitialWeights(const ModelConfig& config, const ParamLayout& layout, uint64_t seed);
  // Layout elements [range.begin, range.end) into dst[0, range.size()) (f32).
  void draw(ElementRange range, float* dst);

 private:
  // One thread's generator and its position (draws taken since seeding).
  struct Walk {
    std::mt19937_64 rng;
    uint64_t at = 0;
  };
  void draw(ElementRange range, float* dst, Walk& walk) const;

  const ModelConfig& config_;
  const ParamLayout& layout_;
  uint64_t seed_;
  std::vector<Walk> walks_;  // one per thread of the team, each moving forward
};

// InitialWeights(config, layout, seed).draw(range, dst).
void draw_initial_range(const ModelConfig& config, const ParamLayout& layout, uint64_t seed,
                        ElementRange range, float* dst);

}  // namespace memfit
