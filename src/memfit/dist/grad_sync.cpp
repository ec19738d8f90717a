#include "memfit/dist/grad_sync.h"

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit::dist {

std::vector<ElementRange> gradient_buckets(ElementRange within, int64_t n, size_t bucket_bytes,
                                           int world, std::span<const ElementRange> shards) {
  std::vector<ElementRange> out;
  auto cut = [&](ElementRange r, int64_t per) {
    for (int64_t end = r.end; end > r.begin; end -= per)
      out.push_back({std::max(r.begin, end - per), end});
  };
  if (shards.empty()) {
    cut(within, bucket_floats(n, bucket_bytes));
    return out;
  }
  // A reduce-scatter's bucket is summed on its owner, which receives every rank's copy of it
  // (Note [Deterministic reduction]), so buckets lie inside one shard and are 1/world of the
  // bytes: the receive buffer is then the all-reduce's, and the bytes moved are the same.
  const int64_t per = std::max<int64_t>(1, bucket_floats(n, bucket_bytes) / std::max(world, 1));
  for (auto s = shards.rbegin(); s != shards.rend(); ++s) cut(s->intersect(within), per);
  return out;
}

int64_t bucket_floats(int64_t n, size_t bucket_bytes) {
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  return std::min(std::max<int64_t>(n, 1), per);
}

namespace {

// Floats of one ring slot on rank `rank`: the largest bucket's receive buffer, at least `world`
// (the scalar sums go through it too).
int64_t slot_floats(int64_t n, size_t bucket_bytes, int world, int rank) {
  const int64_t piece =
      even_counts(bucket_floats(n, bucket_bytes), world)[static_cast<size_t>(rank)];
  return std::max<int64_t>(int64_t{world} * piece, world);
}

}  // namespace

size_t GradientSync::comm_bytes(int64_t n, size_t bucket_bytes, int world, int rank) {
  if (world <= 1) return 0;
  const size_t slot = static_cast<size_t>(slot_floats(n, bucket_bytes, world, rank));
  return MemoryPool::round_up(kInFlight * slot * sizeof(float));
}

GradientSync::GradientSync(Communicator& comm, MemoryPool& pool, std::span<float> grads,
                           size_t bucket_bytes)
    : comm_(comm), grads_(grads) {
  const int64_t n = static_cast<int64_t>(grads.size());
  buckets_ = gradient_buckets({0, n}, n, bucket_bytes, comm.size());
  slot_floats_ = slot_floats(n, bucket_bytes, comm.size(), comm.rank());
  ring_ = pool.allocate(comm_bytes(n, bucket_bytes, comm.size(), comm.rank()), Category::comm,
                        "comm.grad_ring");
}

GradientSync::~GradientSync() = default;  // pending requests wait as they are destroyed

void GradientSync::start(int64_t j) {
  if (static_cast<int>(in_flight_.size()) == kInFlight) wait_oldest();
  const ElementRange b = buckets_[static_cast<size_t>(j)];
  float* slot = static_cast<float*>(ring_.data()) + (j % kInFlight) * slot_floats_;
  const std::span<float> bucket = grads_.subspan(static_cast<size_t>(b.begin),
                                                 static_cast<size_t>(b.size()));
  volume_.all_reduce += b.size() * 4;
  in_flight_.push_back(comm_.all_reduce_async(bucket, {slot, static_cast<size_t>(slot_floats_)}));
}

void GradientSync::wait_oldest() {
  in_flight_.front()->wait();
  in_flight_.erase(in_flight_.begin());
}

void GradientSync::final_from(int64_t from) {
  const int64_t count = static_cast<int64_t>(buckets_.size());
  while (next_ < count && buckets_[static_cast<size_t>(next_)].begin >= from) start(next_++);
  // OpenMPI moves a nonblocking collective only inside MPI calls: give the ones in flight a turn.
  for (auto& r : in_flight_) r->test();
}

void GradientSync::finish() {
  while (next_ < static_cast<int64_t>(buckets_.size())) start(next_++);
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
