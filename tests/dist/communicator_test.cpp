// The collectives against plain references, on whatever world runs the binary: alone (one rank:
// each collective a copy) and, in CI, under `mpirun -n 2` (ctest's dist_mpi_2ranks). Every rank
// can compute every rank's input, so each checks its own result bit for bit against the sum in
// rank order (Note [Deterministic reduction]). Every rank runs the same tests in the same order:
// no ASSERT before a collective (a rank that returned early would leave the others waiting).
#include "memfit/dist/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"
#include "memfit/memory/pool.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

// Rank r's element i: values whose sum depends on the order they are added in.
float value(int r, int64_t i) {
  return (r % 2 ? -1.0f : 1.0f) * (1.0f + float(r) * 1e-3f) * float(1 + (i * 7919) % 1013) /
         float(3 + r);
}

std::vector<int64_t> uneven_counts(int ranks) {
  std::vector<int64_t> c;
  for (int r = 0; r < ranks; ++r) c.push_back(r == 0 && ranks > 1 ? 0 : 37 + 11 * r);
  return c;
}

TEST(Communicator, ReduceScatterIsTheSumInRankOrder) {
  Communicator& w = world();
  const std::vector<int64_t> counts = uneven_counts(w.size());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<float> in(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) in[i] = value(w.rank(), i);
  std::vector<float> out(static_cast<size_t>(counts[w.rank()]), -1.0f);
  w.reduce_scatter(in, out, counts);
  const int64_t first = std::accumulate(counts.begin(), counts.begin() + w.rank(), int64_t{0});
  for (int64_t i = 0; i < counts[w.rank()]; ++i) {
    float want = value(0, first + i);
    for (int q = 1; q < w.size(); ++q) want += value(q, first + i);
    EXPECT_EQ(std::memcmp(&out[i], &want, 4), 0) << "element " << first + i << ": " << out[i]
                                                   << " vs " << want;
  }
}

// bf16 (--grad-dtype bf16, Note [Gradients in bf16]): the ranks' bf16 values widened, added in
// rank order in f32 and rounded once; in place (out is this rank's range of in) and through a
// lent receive buffer.
TEST(Communicator, Bf16ReduceScatterAddsInF32InRankOrderAndRoundsOnce) {
  Communicator& w = world();
  const std::vector<int64_t> counts = uneven_counts(w.size());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  auto bf16_value = [](int r, int64_t i) { return bf16_from_f32(value(r, i)); };
  const int64_t first = std::accumulate(counts.begin(), counts.begin() + w.rank(), int64_t{0});
  const int64_t mine = counts[w.rank()];
  std::vector<uint16_t> in(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) in[i] = bf16_value(w.rank(), i);
  std::vector<uint16_t> receive(static_cast<size_t>(std::max<int64_t>(1, w.receive_floats(counts))));
  w.reduce_scatter_bf16_async(in, std::span<uint16_t>(in.data() + first, size_t(mine)), counts,
                              receive)
      ->wait();
  for (int64_t i = 0; i < mine; ++i) {
    float acc = f32_from_bf16(bf16_value(0, first + i));
    for (int q = 1; q < w.size(); ++q) acc += f32_from_bf16(bf16_value(q, first + i));
    EXPECT_EQ(in[size_t(first + i)], bf16_from_f32(acc)) << "element " << first + i;
  }
}

TEST(Communicator, AllGatherConcatenatesInRankOrder) {
  Communicator& w = world();
  const std::vector<int64_t> counts = uneven_counts(w.size());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  // 16-bit elements (bf16 weights): any element type, nothing added.
  std::vector<uint16_t> mine(static_cast<size_t>(counts[w.rank()]));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = uint16_t(1000 * w.rank() + i);
  std::vector<uint16_t> out(static_cast<size_t>(total), 0xFFFF);
  w.all_gather(mine.data(), out.data(), counts, sizeof(uint16_t));
  int64_t at = 0;
  for (int q = 0; q < w.size(); ++q)
    for (int64_t i = 0; i < counts[q]; ++i, ++at) EXPECT_EQ(out[at], uint16_t(1000 * q + i));

  // In place: the rank's input already sits at its range of the output.
  std::vector<uint16_t> inplace(static_cast<size_t>(total), 0xFFFF);
  const int64_t first = std::accumulate(counts.begin(), counts.begin() + w.rank(), int64_t{0});
  std::copy(mine.begin(), mine.end(), inplace.begin() + first);
  w.all_gather(inplace.data() + first, inplace.data(), counts, sizeof(uint16_t));
  EXPECT_EQ(inplace, out);
}

TEST(Communicator, AllReduceIsTheReduceScattersSumsOnEveryRank) {
  Communicator& w = world();
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{4096}}) {
    std::vector<float> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[i] = value(w.rank(), i);
    auto request = w.all_reduce_async(data);
    for (int i = 0; i < 3; ++i) request->test();  // progress; the gather starts in wait()
    request->wait();
    EXPECT_TRUE(request->test());
    for (int64_t i = 0; i < n; ++i) {
      float want = value(0, i);
      for (int q = 1; q < w.size(); ++q) want += value(q, i);
      EXPECT_EQ(std::memcmp(&data[i], &want, 4), 0) << "n " << n << " element " << i;
    }
  }
}

TEST(Communicator, BroadcastCopiesTheRootsBytes) {
  Communicator& w = world();
  for (int root : {0, w.size() - 1}) {
    std::vector<int32_t> data(257, w.rank() == root ? 7 : -1);
    data[3] = w.rank() == root ? 12345 : 0;
    w.broadcast(data.data(), static_cast<int64_t>(data.size() * sizeof(int32_t)), root);
    EXPECT_EQ(data[0], 7);
    EXPECT_EQ(data[3], 12345);
    EXPECT_EQ(data[256], 7);
  }
  w.barrier();
}

// Every byte has an owner: a reduce-scatter's receive buffer (W pieces of the rank's range) is
// the pool's comm category while the exchange runs, and is given back when it is done.
TEST(Communicator, TheReceiveBufferIsCommMemoryInThePool) {
  Communicator& w = world();
  MemoryPool pool;
  w.set_pool(&pool);
  const std::vector<int64_t> counts = even_counts(1000, w.size());
  std::vector<float> data(1000, 1.0f);
  w.all_reduce(data);
  w.set_pool(nullptr);
  // One process copies (nothing to receive); W ranks receive W pieces of their range.
  const size_t want = w.size() == 1 ? 0
                                    : MemoryPool::round_up(size_t(w.size()) * counts[w.rank()] *
                                                           sizeof(float));
  EXPECT_EQ(pool.bytes_peak(Category::comm), want);
  EXPECT_EQ(pool.bytes_current(), 0u);
  for (float x : data) EXPECT_EQ(x, float(w.size()));
}

TEST(Communicator, CountsForAnotherWorldAreADistError) {
  Communicator& w = world();
  std::vector<float> in(4), out(4);
  const std::vector<int64_t> wrong(static_cast<size_t>(w.size() + 1), 1);
  EXPECT_THROW(w.reduce_scatter(in, out, wrong), DistError);  // refused before any transfer
}

TEST(Communicator, EvenCountsSplitTheRemainderOverTheFirstRanks) {
  EXPECT_EQ(even_counts(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(even_counts(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(even_counts(0, 2), (std::vector<int64_t>{0, 0}));
}

TEST(Communicator, TheWorldIsTheLaunchersOrOneProcess) {
  Communicator& w = world();
  EXPECT_EQ(w.size() > 1, launched_as_ranks() && w.size() > 1);
  if (!launched_as_ranks()) {
    EXPECT_EQ(w.size(), 1);
    EXPECT_EQ(w.describe(), "single process");
  } else {
    EXPECT_NE(w.describe().find("MPI"), std::string::npos) << w.describe();
  }
  EXPECT_GE(w.rank(), 0);
  EXPECT_LT(w.rank(), w.size());
}

}  // namespace
}  // namespace memfit::dist
