// The step arena's offset assigner, ggml's gallocr on a fixed schedule: buffers with a size and
// a lifetime (the phases of a step in which their bytes hold a value someone will read) get
// offsets in one slab so that two buffers share bytes only where their lifetimes are disjoint.
// The model lays out its activations and workspace with it once per reserve(), and the planner
// runs the same function, so the predicted slab is the allocated one (docs/notes/planner.md,
// Note [Step arena]).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

namespace memfit {

// Phases [first, last] of a step, both included.
struct LiveSpan {
  int first = 0, last = 0;
  bool operator==(const LiveSpan&) const = default;
};

// The phases in which a buffer's bytes matter: one span per value it holds (from the phase that
// writes it to the last phase that reads it), in order and not overlapping; spans may touch.
struct Lifetime {
  std::vector<LiveSpan> spans;
  bool live_at(int phase) const;
  bool overlaps(const Lifetime& other) const;
};

struct ArenaLayout {
  std::vector<size_t> offsets;  // one per buffer, in the input order
  size_t bytes = 0;             // the slab: the highest end of any buffer
};

// Greedy by size, as gallocr and TFLite's arena planner: the largest buffer first (ties: the
// earlier first phase, then the input order), each at the lowest offset where it overlaps no
// placed buffer whose lifetime intersects its own; and greedy again with the latest-ending
// buffers first (then by size), keeping the smaller slab (by size where they tie). Sizes must
// be multiples of the alignment the offsets need (the pool's, kPoolAlignment), and every
// lifetime needs a span (a buffer that is never live has no place in a step). Deterministic:
// the same input gives the same layout.
// `pinned` (empty, or one entry per buffer): a buffer with a value keeps that offset and is
// placed before the others, which then fit around it (the gradient slab's units, whose
// offsets are the parameter layout's: Note [Gradients by lifetime]). Pinned buffers whose
// lifetimes intersect must not share a byte.
ArenaLayout assign_offsets(const std::vector<size_t>& bytes,
                           const std::vector<Lifetime>& lifetimes,
                           const std::vector<std::optional<size_t>>& pinned = {});

}  // namespace memfit
