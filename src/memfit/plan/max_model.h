// memfit plan --max-model: the largest model of the preset's family (GPT-2 or LLaMA), by
// parameter count, that trains under a budget, with the checkpoint policy (and, with --auto-batch, the micro-batch)
// the search (plan/search.h) picks for it. Nothing is allocated or run.
// Note [Max model] in docs/notes/planner.md: the family rule and why the search may bisect.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "memfit/plan/search.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

// One member of a family: n_layer blocks, d_model wide, heads of 64 (GPT-2) or 128 (LLaMA)
// dimensions; LLaMA's key/value heads and MLP width too (0 for GPT-2).
struct FamilyShape {
  int n_layer = 0, d_model = 0, n_head = 0;
  int n_kv_head = 0, ffn_dim = 0;
};

inline constexpr int kFamilyHeadSize = 64;
inline constexpr int kLlamaFamilyHeadSize = 128;
inline constexpr int kMaxFamilyLayers = 256;  // where --max-model stops looking

// The family's member with n_layer blocks: the width interpolates GPT-2's published shapes
// (12 x 768, 24 x 1024, 36 x 1280, 48 x 1600) linearly in the depth, continues the end
// segments' slopes outside them, and rounds to a multiple of 64, so gpt2, gpt2-medium,
// gpt2-large and gpt2-xl are members; parameters grow with n_layer. ConfigError if n_layer < 1.
FamilyShape gpt2_family_shape(int n_layer);

// The LLaMA family's member with n_layer blocks: the width interpolates Meta's published shapes
// (Llama 3.2 1B 16 x 2048, Llama 2 7B 32 x 4096, 13B 40 x 5120, 70B 80 x 8192) as GPT-2's does,
// rounded to heads of 128; the base's query heads per key/value head (1 for Llama 2 7B, 4 for
// Llama 3 8B) and MLP ratio (ffn_dim / d_model, rounded up to a multiple of 256, as Meta's
// multiple_of) carry over, so llama2-7b and llama2-13b are members.
FamilyShape llama_family_shape(const ModelConfig& base, int n_layer);
// The member of base's family.
FamilyShape family_shape(const ModelConfig& base, int n_layer);
// How family_shape draws the family's line, as `memfit plan --max-model` says it.
std::string_view family_shape_rule(Family family);

// base with the shape's n_layer, d_model and n_head, and LLaMA's n_kv_head and ffn_dim (its
// vocabulary and context stay), and the policy left to the search (--ckpt auto), or `policy`
// where one is fixed (--max-model --ckpt full).
RunSpec with_family_shape(const RunSpec& base, FamilyShape shape,
                          const std::optional<CheckpointPolicy>& policy = std::nullopt);

struct ShapeFit {
  FamilyShape shape;
  int64_t params = 0;
  SearchResult search;  // search.fits, and search.choice (the smallest when nothing fits)
  // --offload-optimizer nvme: the offload files' bytes (over several ranks the largest rank's
  // shard's), and whether they fit the disk limit (--disk-limit, each rank's, else the free
  // space of --offload-dir). fits() needs both.
  uint64_t disk_bytes = 0;
  bool disk_fits = true;
  bool fits() const { return search.fits && disk_fits; }
};

struct MaxModelResult {
  Family family = Family::gpt2;  // the preset's, whose members were searched
  size_t limit = 0;  // each rank's, over several ranks: every rank's peak must fit it
  int world = 1;     // the ranks planned (--world-size)
  uint64_t disk_limit = 0;  // with offload: the disk the members' files had to fit
  bool found = false;  // some member fits
  ShapeFit best;       // the largest member that fits (the 1-layer member when none does)
  bool capped = false;  // every member up to kMaxFamilyLayers fits
  std::vector<ShapeFit> neighbours;  // members around best, by depth, best among them
  int shapes_planned = 0;
  std::optional<CheckpointPolicy> policy;  // the fixed policy planned; none: each member's best
};

// The largest member of base.model's family whose search fits `limit`, with base's other
// settings (vocabulary, context, batch, precision, optimizer, attention, --auto-batch, the
// world size and ZeRO stage, or --zero auto). Over several ranks `limit` is each rank's: a
// member fits when every rank's planned peak does (search_training). What
// the search varies must be left to it: the run setup refuses --n-layer, --d-model, --n-head,
// a --ckpt layers: list, --resume and --init-from with --max-model
// (cli/options/resolve_train_spec.h).
// `policy`, if given, is every member's checkpoint policy (--max-model --ckpt full: the
// largest model under that policy) instead of each member's fastest that fits.
MaxModelResult find_max_model(const RunSpec& base, size_t limit,
                              const std::optional<CheckpointPolicy>& policy = std::nullopt);

}  // namespace memfit
