#include "memfit/dist/grad_sync.h"

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit::dist {

namespace {

// Bucket j of n floats in buckets of `per`: [n - (j+1) per, n - j per), clipped at 0 (the
// slab's end first, as the backward finishes it).
ElementRange bucket_range(int64_t n, int64_t per, int64_t j) {
  const int64_t end = n - j * per;
  return {std::max<int64_t>(0, end - per), end};
}

// Each rank's part of `bucket` (reduce-scatter counts).
std::vector<int64_t> shard_counts(const ElementRange& bucket, std::span<const ElementRange> shards) {
  std::vector<int64_t> counts;
  for (const ElementRange& s : shards) counts.push_back(s.intersect(bucket).size());
  return counts;
}

// Floats of one ring slot on rank `rank`: the largest bucket's receive buffer, at least `world`.
int64_t slot_floats(int64_t n, size_t bucket_bytes, int world, int rank,
                    std::span<const ElementRange> shards) {
  const int64_t per = bucket_floats(n, bucket_bytes);
  int64_t piece = even_counts(per, world)[static_cast<size_t>(rank)];
  if (!shards.empty()) {
    piece = 0;
    const int64_t buckets = (n + per - 1) / per;
    for (int64_t j = 0; j < buckets; ++j)
      piece = std::max(piece, shards[static_cast<size_t>(rank)].intersect(bucket_range(n, per, j)).size());
  }
  return std::max<int64_t>(int64_t{world} * piece, world);
}

}  // namespace

int64_t bucket_floats(int64_t n, size_t bucket_bytes) {
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  return std::min(std::max<int64_t>(n, 1), per);
}

size_t GradientSync::comm_bytes(int64_t n, size_t bucket_bytes, int world, int rank,
                                std::span<const ElementRange> shards) {
  if (world <= 1) return 0;
  const size_t slot = static_cast<size_t>(slot_floats(n, bucket_bytes, world, rank, shards));
  return MemoryPool::round_up(kInFlight * slot * sizeof(float));
}

GradientSync::GradientSync(Communicator& comm, MemoryPool& pool, std::span<float> grads,
                           size_t bucket_bytes, std::vector<ElementRange> shards)
    : comm_(comm), grads_(grads), shards_(std::move(shards)) {
  const int64_t n = static_cast<int64_t>(grads.size());
  MEMFIT_CHECK(shards_.empty() || (static_cast<int>(shards_.size()) == comm.size() &&
                                   shards_.front().begin == 0 && shards_.back().end == n),
               "dist", "{} shards for {} ranks do not tile {} gradients", shards_.size(),
               comm.size(), n);
  per_ = bucket_floats(n, bucket_bytes);
  buckets_ = (n + per_ - 1) / per_;
  slot_floats_ = slot_floats(n, bucket_bytes, comm.size(), comm.rank(), shards_);
  ring_ = pool.allocate(comm_bytes(n, bucket_bytes, comm.size(), comm.rank(), shards_),
                        Category::comm, "comm.grad_ring");
}

GradientSync::~GradientSync() = default;  // pending requests wait as they are destroyed

// Bucket j covers [n - (j+1) per, n - j per), clipped at 0: the slab's end first, as the
// backward finishes it.
void GradientSync::start(int64_t j) {
  if (static_cast<int>(in_flight_.size()) == kInFlight) wait_oldest();
  const ElementRange b = bucket_range(static_cast<int64_t>(grads_.size()), per_, j);
  float* slot = static_cast<float*>(ring_.data()) + (j % kInFlight) * slot_floats_;
  const std::span<float> bucket = grads_.subspan(static_cast<size_t>(b.begin),
                                                 static_cast<size_t>(b.size()));
  if (shards_.empty()) {
    in_flight_.push_back(comm_.all_reduce_async(bucket, {slot, static_cast<size_t>(slot_floats_)}));
    return;
  }
  // Stage 2: this rank's part of the bucket gets the sums, in place.
  const std::vector<int64_t> counts = shard_counts(b, shards_);
  const ElementRange mine = shards_[static_cast<size_t>(comm_.rank())].intersect(b);
  in_flight_.push_back(comm_.reduce_scatter_async(
      bucket, grads_.subspan(static_cast<size_t>(mine.begin), static_cast<size_t>(mine.size())),
      counts, {slot, static_cast<size_t>(slot_floats_)}));
}

void GradientSync::wait_oldest() {
  in_flight_.front()->wait();
  in_flight_.erase(in_flight_.begin());
}

void GradientSync::final_from(int64_t from) {
  const int64_t n = static_cast<int64_t>(grads_.size());
  while (next_ < buckets_ && std::max<int64_t>(0, n - (next_ + 1) * per_) >= from) start(next_++);
  // OpenMPI moves a nonblocking collective only inside MPI calls: give the ones in flight a turn.
  for (auto& r : in_flight_) r->test();
}

void GradientSync::finish() {
  while (next_ < buckets_) start(next_++);
  while (!in_flight_.empty()) wait_oldest();
  next_ = 0;  // the next step's exchange starts from the slab's end again
}

float GradientSync::sum(float x) {
  MEMFIT_CHECK(in_flight_.empty(), "dist", "a scalar sum while {} buckets are in flight",
               in_flight_.size());
  comm_.all_reduce({&x, 1}, {static_cast<float*>(ring_.data()), static_cast<size_t>(slot_floats_)});
  return x;
}

}  // namespace memfit::dist
