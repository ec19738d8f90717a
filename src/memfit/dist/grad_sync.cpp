#include "memfit/dist/grad_sync.h"

#include <algorithm>

#include "memfit/memory/pool.h"

namespace memfit::dist {

int64_t bucket_floats(int64_t n, size_t bucket_bytes) {
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  return std::min(std::max<int64_t>(n, 1), per);
}

size_t all_reduce_comm_bytes(int64_t n, size_t bucket_bytes, int world, int rank) {
  if (world <= 1 || n == 0) return 0;
  const int64_t first = bucket_floats(n, bucket_bytes);
  const int64_t mine = even_counts(first, world)[static_cast<size_t>(rank)];
  return MemoryPool::round_up(
      std::max<size_t>(static_cast<size_t>(world * mine) * sizeof(float), 1));
}

void all_reduce_buckets(Communicator& comm, std::span<float> data, size_t bucket_bytes) {
  if (comm.size() == 1) return;
  const int64_t n = static_cast<int64_t>(data.size());
  const int64_t per = bucket_floats(n, bucket_bytes);
  for (int64_t at = 0; at < n; at += per)
    comm.all_reduce(data.subspan(static_cast<size_t>(at), static_cast<size_t>(std::min(per, n - at))));
}

}  // namespace memfit::dist
