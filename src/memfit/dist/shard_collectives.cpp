#include "memfit/dist/shard_collectives.h"

namespace memfit::dist {

std::vector<int64_t> shard_counts(std::span<const ElementRange> shards, ElementRange within) {
  std::vector<int64_t> counts;
  for (const ElementRange& s : shards) counts.push_back(s.intersect(within).size());
  return counts;
}

std::vector<int64_t> shard_counts(std::span<const ElementRange> shards) {
  std::vector<int64_t> counts;
  for (const ElementRange& s : shards) counts.push_back(s.size());
  return counts;
}

void all_gather_shards(Communicator& comm, std::span<const ElementRange> shards, const void* mine,
                       void* whole, size_t elem_bytes) {
  comm.all_gather(mine, whole, shard_counts(shards), static_cast<int>(elem_bytes));
}

}  // namespace memfit::dist
