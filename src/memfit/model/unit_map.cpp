// Which unit of a layout holds what (model/unit_map.h).
#include "memfit/model/unit_map.h"

#include "memfit/core/error.h"

namespace memfit {

size_t UnitMap::block_unit(int l) const {
  MEMFIT_CHECK(has_block(l), "params", "block {} is not in this layout (blocks {} to {})", l,
               first_layer, first_layer + blocks - 1);
  return static_cast<size_t>(first_block + (l - first_layer));
}

UnitMap unit_map(const ParamLayout& layout) {
  UnitMap m;
  m.units = unit_ranges(layout);
  m.layer.assign(m.units.size(), -1);
  // Each unit starts at a parameter (unit_ranges): its first parameter says what it is.
  const std::vector<ParamInfo>& ps = layout.params();
  size_t p = 0;
  for (size_t u = 0; u < m.units.size(); ++u) {
    while (p < ps.size() && ps[p].offset < m.units[u].begin) ++p;
    MEMFIT_CHECK(p < ps.size(), "params", "unit {} of {} starts past the last parameter", u,
                 m.units.size());
    const ParamInfo& first = ps[p];
    const int i = static_cast<int>(u);
    if (first.layer >= 0) {
      m.layer[u] = first.layer;
      if (m.first_block < 0) {
        m.first_block = i;
        m.first_layer = first.layer;
      }
      MEMFIT_CHECK(first.layer == m.first_layer + m.blocks && i == m.first_block + m.blocks,
                   "params", "unit {} is block {}, after {} blocks from block {}", u,
                   first.layer, m.blocks, m.first_layer);
      ++m.blocks;
    } else if (first.role == ParamRole::token_embedding && u > 0) {
      m.copy = i;  // a tied last stage's copy of the table, after the tail
    } else if (first.role == ParamRole::token_embedding ||
               first.role == ParamRole::position_embedding) {
      m.embeddings = i;
    } else {
      m.tail = i;
    }
  }
  return m;
}

}  // namespace memfit
