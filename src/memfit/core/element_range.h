// A range of elements of the parameter layout's slab, [begin, end): what a ZeRO rank owns
// (its shard), what one block occupies (the unit of gather and of I/O), what an optimizer
// steps. See Note [Model state] (docs/notes/model-state.md).
#pragma once

#include <algorithm>
#include <cstdint>

namespace memfit {

struct ElementRange {
  int64_t begin = 0, end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool contains(const ElementRange& r) const { return begin <= r.begin && r.end <= end; }
  // The common part (empty, at max(begin), when there is none).
  ElementRange intersect(const ElementRange& r) const {
    const int64_t b = std::max(begin, r.begin);
    return {b, std::max(b, std::min(end, r.end))};
  }
  bool operator==(const ElementRange&) const = default;
};

}  // namespace memfit
