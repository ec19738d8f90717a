// The process's resident set size, for logs that watch memory outside the pool (the soak
// benchmark, bench/e2e/soak.py): the pool counts tensors, RSS counts everything else too
// (oneDNN's caches, the heap, mapped checkpoints).
#pragma once

#include <cstddef>

namespace memfit {

// Bytes of this process resident in RAM now (Linux: /proc/self/statm); 0 where unknown.
size_t process_rss_bytes();

}  // namespace memfit
