// Data parallelism's gradient exchange: every rank's gradients summed into every rank's, a
// bucket at a time, started while the backward is still running (the backward finishes the
// gradient slab from its end: Transformer::backward(final_from)), at most kInFlight buckets in
// flight. The receive buffers are a ring of kInFlight allocated once (Category::comm), so the
// plan (comm_bytes) is exact whatever the timing. The sums are the communicator's, in rank
// order (Note [Deterministic reduction]): the same bits whatever the bucket size or the overlap.
// ZeRO stage 2 gives the shards: each bucket (inside one shard: gradient_buckets) is then
// reduce-scattered into its owner (the sums written in place; the rest of the slab keeps this
// rank's own gradients), the same sums in the same order as the all-reduce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "memfit/dist/comm_volume.h"
#include "memfit/dist/communicator.h"
#include "memfit/memory/pool.h"
#include "memfit/state/element_range.h"

namespace memfit::dist {

// Floats per bucket for `n` gradients in buckets of `bucket_bytes` (at least one float; all of
// them when the bucket is larger).
int64_t bucket_floats(int64_t n, size_t bucket_bytes);

// The buckets of an exchange over `n` gradients, in the order they are started (the slab's end
// first, as the backward finishes it). All-reduce (no shards): bucket_floats each. Stage 2's
// reduce-scatter (`shards`, one per rank): each inside one shard, bucket_floats / world each,
// so the owner's receive buffer (world copies) is the all-reduce's.
std::vector<ElementRange> gradient_buckets(int64_t n, size_t bucket_bytes, int world,
                                           std::span<const ElementRange> shards = {});

class GradientSync {
 public:
  static constexpr int kInFlight = 2;

  // The comm bytes a rank holds for the exchange: kInFlight receive buffers of the largest
  // bucket (at least `world` floats each, for the scalar sums); 0 for one rank. What the
  // constructor allocates. With `shards` (stage 2), a reduce-scatter's receive buffer: `world`
  // times the largest part of this rank's shard in one bucket.
  static size_t comm_bytes(int64_t n, size_t bucket_bytes, int world, int rank,
                           std::span<const ElementRange> shards = {});

  // Over `grads` (n floats), for the run's lifetime. `shards` (one per rank, tiling the slab):
  // reduce-scatter into their owners instead of all-reducing.
  GradientSync(Communicator& comm, MemoryPool& pool, std::span<float> grads, size_t bucket_bytes,
               std::vector<ElementRange> shards = {});
  ~GradientSync();

  // The gradients [from, n) are final: start every bucket inside them not started yet.
  void final_from(int64_t from);
  // Every gradient is final: start the rest, wait for all; the slab then holds the sums.
  void finish();
  // The sum over ranks of x (the loss, the stop flag), through the ring: nothing allocated.
  // Not while buckets are in flight.
  float sum(float x);
  // The gradient bytes all-reduced or reduce-scattered since the last take_volume().
  CommVolume take_volume() { return std::exchange(volume_, CommVolume{}); }

 private:
  void start(int64_t bucket);
  void wait_oldest();

  Communicator& comm_;
  std::span<float> grads_;
  std::vector<ElementRange> shards_;  // stage 2: reduce-scatter into these owners
  std::vector<ElementRange> buckets_;
  int64_t next_ = 0;
  CommVolume volume_;
  int64_t slot_floats_ = 0;
  Allocation ring_;
  std::vector<std::unique_ptr<Request>> in_flight_;  // oldest first
};

}  // namespace memfit::dist
