// Data parallelism's gradient exchange: every rank's gradients summed into every rank's, a
// bucket at a time, so the collectives' receive buffer (Category::comm) is one bucket's, not the
// model's. The sums are the communicator's, in rank order (Note [Deterministic reduction]), so
// they do not depend on the bucket size. The planner counts the buffer with
// all_reduce_comm_bytes, the same arithmetic the exchange allocates by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "memfit/dist/communicator.h"

namespace memfit::dist {

// Floats per bucket for `n` gradients in buckets of `bucket_bytes` (at least one float; all of
// them when the bucket is larger).
int64_t bucket_floats(int64_t n, size_t bucket_bytes);

// The comm bytes rank `rank` of `world` holds while a bucket is in flight: the receive buffer of
// the largest (the first) bucket, as the pool rounds it; 0 for one rank.
size_t all_reduce_comm_bytes(int64_t n, size_t bucket_bytes, int world, int rank);

// data = the sum over ranks of data, bucket after bucket.
void all_reduce_buckets(Communicator& comm, std::span<float> data, size_t bucket_bytes);

}  // namespace memfit::dist
