// The process's resident set size, for logs that watch memory outside the pool (the soak
// benchmark, bench/e2e/soak.py): the pool counts tensors, RSS counts everything else too
// (oneDNN's caches, the heap, mapped checkpoints).
#pragma once

#include <cstddef>

namespace memfit {

// Bytes of this process resident in RAM now (Linux: /proc/self/statm); 0 where unknown.
size_t process_rss_bytes();

// Bytes of the one mapping that contains `addr` (a mapped file, say) resident in this process's
// page tables now (Linux: the mapping's Rss in /proc/self/smaps); 0 where unknown. Unlike the
// process's RSS it sees nothing else: not the heap, not a sanitizer's shadow memory.
size_t mapping_rss_bytes(const void* addr);

}  // namespace memfit
