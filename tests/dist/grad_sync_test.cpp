// The gradient exchange of data parallelism and ZeRO stage 2, on whatever world runs the binary
// (alone, and in CI under mpirun -n 2 and -n 4: ctest -L dist-mpi): stage 2's reduce-scatter
// into uneven shards leaves each owner the same bits the all-reduce gives it, whatever the
// bucketing, and the ring is the bytes comm_bytes plans, no more than the all-reduce's. No ASSERT before a collective.
#include "memfit/dist/grad_sync.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "memfit/memory/pool.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

float value(int r, int64_t i) {
  return (r % 2 ? -1.0f : 1.0f) * (1.0f + float(r) * 1e-3f) * float(1 + (i * 7919) % 1013) /
         float(3 + r);
}

// Uneven shards tiling n: rank r gets a share growing with r (rank 0 the smallest).
std::vector<ElementRange> uneven_shards(int64_t n, int ranks) {
  std::vector<ElementRange> s;
  int64_t weight = 0, total_weight = int64_t{ranks} * (ranks + 1) / 2, at = 0;
  for (int r = 0; r < ranks; ++r) {
    weight += r + 1;
    const int64_t end = r + 1 == ranks ? n : n * weight / total_weight;
    s.push_back({at, end});
    at = end;
  }
  return s;
}

// The slab after the exchange: all-reduce (no shards) or reduce-scatter into `shards`, with the
// backward's suffixes announced in steps of `stride`.
std::vector<float> exchange(int64_t n, size_t bucket_bytes, std::vector<ElementRange> shards,
                            size_t* ring_bytes) {
  Communicator& w = world();
  MemoryPool pool;
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[i] = value(w.rank(), i);
  {
    GradientSync sync(w, pool, g, bucket_bytes, shards);
    *ring_bytes = pool.bytes_current();
    for (int64_t from = n; from > 0; from -= 97) sync.final_from(from);
    sync.finish();
  }
  return g;
}

TEST(GradientSync, ReduceScatterGivesEachOwnerTheAllReducesBits) {
  Communicator& w = world();
  const int64_t n = 5003;
  for (size_t bucket_bytes : {size_t{4 * 300}, size_t{4 * 1777}, size_t{1} << 20}) {
    const std::vector<ElementRange> shards = uneven_shards(n, w.size());
    size_t ring_all = 0, ring_rs = 0;
    const std::vector<float> all = exchange(n, bucket_bytes, {}, &ring_all);
    const std::vector<float> rs = exchange(n, bucket_bytes, shards, &ring_rs);
    const ElementRange mine = shards[static_cast<size_t>(w.rank())];
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      float want = value(0, i);
      for (int q = 1; q < w.size(); ++q) want += value(q, i);
      EXPECT_EQ(std::memcmp(&rs[i], &want, 4), 0) << "element " << i;
      EXPECT_EQ(std::memcmp(&rs[i], &all[i], 4), 0) << "element " << i;
    }
    if (w.size() == 1) continue;  // the trainer makes no exchange for one rank
    EXPECT_EQ(ring_all, GradientSync::comm_bytes(n, bucket_bytes, w.size(), w.rank()));
    EXPECT_EQ(ring_rs, GradientSync::comm_bytes(n, bucket_bytes, w.size(), w.rank(), shards));
    // Stage 2's buckets lie in one shard at 1/W of the size: the owner's W copies take no more
    // than the all-reduce's receive buffer, however uneven the shards.
    EXPECT_LE(ring_rs, ring_all);
    for (const ElementRange& b : gradient_buckets(n, bucket_bytes, w.size(), shards)) {
      int owners = 0;
      for (const ElementRange& s : shards) owners += s.contains(b);
      EXPECT_EQ(owners, 1) << "bucket [" << b.begin << ", " << b.end << ") straddles shards";
    }
  }
}

}  // namespace
}  // namespace memfit::dist
