// The gradient exchange of data parallelism (stages 0-1), on whatever world runs the binary
// (alone, and in CI under mpirun -n 2 and -n 4: ctest -L dist-mpi): the all-reduce leaves every
// rank the sums in rank order whatever the bucketing, and the ring is the bytes comm_bytes plans;
// the buckets stages 2-3 reduce-scatter (gradient_buckets with shards) lie inside one shard and
// tile the range they cut, no larger than the all-reduce's receive buffer allows. Stages 2-3's
// exchange itself is tests/dist/unit_grads_test.cpp. No ASSERT before a collective.
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

// The slab after the all-reduce, with the backward's suffixes announced in steps of 97.
std::vector<float> exchange(int64_t n, size_t bucket_bytes, size_t* ring_bytes) {
  Communicator& w = world();
  MemoryPool pool;
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[i] = value(w.rank(), i);
  {
    GradientSync sync(w, pool, g, bucket_bytes);
    *ring_bytes = pool.bytes_current();
    for (int64_t from = n; from > 0; from -= 97) sync.final_from(from);
    sync.finish();
  }
  return g;
}

TEST(GradientSync, AllReduceGivesEveryRankTheSumsInRankOrder) {
  Communicator& w = world();
  const int64_t n = 5003;
  for (size_t bucket_bytes : {size_t{4 * 300}, size_t{4 * 1777}, size_t{1} << 20}) {
    size_t ring = 0;
    const std::vector<float> all = exchange(n, bucket_bytes, &ring);
    for (int64_t i = 0; i < n; ++i) {
      float want = value(0, i);
      for (int q = 1; q < w.size(); ++q) want += value(q, i);
      EXPECT_EQ(std::memcmp(&all[i], &want, 4), 0) << "element " << i;
    }
    if (w.size() == 1) continue;  // the trainer makes no exchange for one rank
    EXPECT_EQ(ring, GradientSync::comm_bytes(n, bucket_bytes, w.size(), w.rank()));
  }
}

// Stages 2-3's buckets: inside one shard, 1/W of the all-reduce's, tiling what they cut (the
// whole slab or one unit), so an owner's W copies fit the all-reduce's receive buffer.
TEST(GradientBuckets, ReduceScatterBucketsLieInOneShardAndTileTheirRange) {
  const int64_t n = 5003;
  for (int ranks : {1, 2, 3, 5}) {
    const std::vector<ElementRange> shards = uneven_shards(n, ranks);
    for (size_t bucket_bytes : {size_t{4 * 300}, size_t{4 * 1777}, size_t{1} << 20}) {
      const int64_t per = std::max<int64_t>(1, bucket_floats(n, bucket_bytes) / ranks);
      for (ElementRange within : {ElementRange{0, n}, ElementRange{1234, 4321}}) {
        int64_t covered = 0, end = within.end;
        for (const ElementRange& b : gradient_buckets(within, n, bucket_bytes, ranks, shards)) {
          int owners = 0;
          for (const ElementRange& s : shards) owners += s.contains(b);
          EXPECT_EQ(owners, 1) << "bucket [" << b.begin << ", " << b.end << ") straddles shards";
          EXPECT_LE(b.size(), per);
          EXPECT_EQ(b.end, end) << "the buckets run from the end, without gaps";
          end = b.begin;
          covered += b.size();
        }
        EXPECT_EQ(covered, within.size());
        EXPECT_EQ(end, within.begin);
      }
    }
  }
}

}  // namespace
}  // namespace memfit::dist
