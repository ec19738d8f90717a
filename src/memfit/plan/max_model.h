// memfit plan --max-model: the largest model of the GPT-2 family, by parameter count, that
// trains under a budget, with the checkpoint policy (and, with --auto-batch, the micro-batch)
// the search (plan/search.h) picks for it. Nothing is allocated or run.
// Note [Max model] in docs/notes/planner.md: the family rule and why the search may bisect.
#pragma once

#include <cstdint>
#include <vector>

#include "memfit/plan/search.h"
#include "memfit/train/train_config.h"

namespace memfit {

// One member of the family: n_layer blocks, d_model wide, heads of 64 dimensions.
struct FamilyShape {
  int n_layer = 0, d_model = 0, n_head = 0;
};

inline constexpr int kFamilyHeadSize = 64;
inline constexpr int kMaxFamilyLayers = 256;  // where --max-model stops looking

// The family's member with n_layer blocks: the width interpolates GPT-2's published shapes
// (12 x 768, 24 x 1024, 36 x 1280, 48 x 1600) linearly in the depth, continues the end
// segments' slopes outside them, and rounds to a multiple of 64, so gpt2, gpt2-medium,
// gpt2-large and gpt2-xl are members; parameters grow with n_layer. ConfigError if n_layer < 1.
FamilyShape gpt2_family_shape(int n_layer);

// base with the shape's n_layer, d_model and n_head (its vocabulary and context stay).
TrainConfig with_family_shape(const TrainConfig& base, FamilyShape shape);

struct ShapeFit {
  FamilyShape shape;
  int64_t params = 0;
  SearchResult search;  // search.fits, and search.choice (the smallest when nothing fits)
};

struct MaxModelResult {
  size_t limit = 0;
  bool found = false;  // some member fits
  ShapeFit best;       // the largest member that fits (the 1-layer member when none does)
  bool capped = false;  // every member up to kMaxFamilyLayers fits
  std::vector<ShapeFit> neighbours;  // members around best, by depth, best among them
  int shapes_planned = 0;
};

// The largest member of the family whose search fits `limit`, with base's other settings
// (vocabulary, context, batch, precision, optimizer, attention, --auto-batch). ConfigError if
// base fixes what the search varies: --n-layer, --d-model, --n-head, a --ckpt policy (auto or
// the default none are fine), --resume or --init-from.
MaxModelResult find_max_model(const TrainConfig& base, size_t limit);

}  // namespace memfit
