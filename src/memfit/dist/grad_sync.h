// Data parallelism's gradient exchange (ZeRO stages 0-1): every rank's gradients summed into
// every rank's, a bucket at a time, started while the backward is still running (the backward
// finishes the gradient slab from its end: Transformer::backward(final_from)), at most kInFlight
// buckets in flight. The receive buffers are a ring of kInFlight allocated once (Category::comm),
// so the plan (comm_bytes) is exact whatever the timing. The sums are the communicator's, in rank
// order (Note [Deterministic reduction]): the same bits whatever the bucket size or the overlap.
// Stages 2-3 reduce-scatter per unit instead (dist/zero/unit_grads.h), in gradient_buckets' cut.
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
#include "memfit/core/element_range.h"

namespace memfit::dist {

// Floats per bucket for `n` gradients in buckets of `bucket_bytes` (at least one float; all of
// them when the bucket is larger).
int64_t bucket_floats(int64_t n, size_t bucket_bytes);

// The buckets of an exchange over the gradients `within` a slab of `n`, in the order they are
// started (the end first, as the backward finishes it). All-reduce (no shards): bucket_floats
// of the slab each. A reduce-scatter (`shards`, one per rank; stages 2-3): each inside one shard,
// bucket_floats / world each, so the owner's receive buffer (world copies) is the all-reduce's.
std::vector<ElementRange> gradient_buckets(ElementRange within, int64_t n, size_t bucket_bytes,
                                           int world, std::span<const ElementRange> shards = {});

class GradientSync {
 public:
  static constexpr int kInFlight = 2;

  // The comm bytes a rank holds for the exchange: kInFlight receive buffers of the largest
  // bucket (at least `world` floats each, for the scalar sums); 0 for one rank. What the
  // constructor allocates.
  static size_t comm_bytes(int64_t n, size_t bucket_bytes, int world, int rank);

  // Over `grads` (n floats), for the run's lifetime.
  GradientSync(Communicator& comm, MemoryPool& pool, std::span<float> grads, size_t bucket_bytes);
  ~GradientSync();

  // The gradients [from, n) are final: start every bucket inside them not started yet.
  void final_from(int64_t from);
  // Every gradient is final: start the rest, wait for all; the slab then holds the sums.
  void finish();
  // The sum over ranks of x (the loss, the stop flag), through the ring: nothing allocated.
  // Not while buckets are in flight.
  float sum(float x);
  // The gradient bytes all-reduced since the last take_volume().
  CommVolume take_volume() { return std::exchange(volume_, CommVolume{}); }

 private:
  void start(int64_t bucket);
  void wait_oldest();

  Communicator& comm_;
  std::span<float> grads_;
  std::vector<ElementRange> buckets_;
  int64_t next_ = 0;
  CommVolume volume_;
  int64_t slot_floats_ = 0;
  Allocation ring_;
  std::vector<std::unique_ptr<Request>> in_flight_;  // oldest first
};

}  // namespace memfit::dist
