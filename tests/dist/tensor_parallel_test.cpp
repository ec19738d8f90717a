// Tensor parallelism's first pieces against one process, on whatever world runs the binary as
// one tensor group: alone (a group of one), and in CI under `mpirun -n 2` and `-n 4
// --oversubscribe` (ctest's dist_mpi_2ranks and dist_mpi_4ranks). Every rank builds the same
// whole inputs from the same seeds, computes the one-process result itself, and checks its own
// part of the parallel result against it:
//   - the tensor group's collectives (sums in rank order, maxima, gathers; the same bits on
//     every rank);
//   - the vocabulary-parallel cross-entropy on logits of 80 to 100 with a vocabulary the rank
//     count does not divide: losses and gradients within 1e-6 of crossentropy.h's;
//   - column- and row-parallel linears, forward and backward, within 1e-6 of the plain matmul.
// No ASSERT before a collective (a rank that returned early would leave the others waiting).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memfit/dist/communicator.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/dist/process_grid.h"
#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/parallel_linear.h"
#include "memfit/model/vocab_parallel_crossentropy.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

Tensor make(MemoryPool& pool, Shape shape, DType dtype = DType::f32) {
  return Tensor::empty(pool, shape, dtype, Category::activations, "test");
}

// The same values on every rank: uniform in [lo, hi) from the seed.
Tensor random_tensor(MemoryPool& pool, Shape shape, uint32_t seed, float lo, float hi) {
  Tensor t = make(pool, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

// Columns [c0, c0 + n) of a (rows, cols) f32 tensor, as a new contiguous one.
Tensor columns(MemoryPool& pool, const Tensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.size(0), cols = t.size(1);
  Tensor out = make(pool, {rows, n});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      out.data<float>()[r * n + j] = c0 + j < cols ? t.data<float>()[r * cols + c0 + j] : 0.0f;
  return out;
}

std::vector<float> floats(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// Element-wise |got - want| <= rtol |want| + atol; the first offender named.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double rtol, double atol = 0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i]));
    if (!(err <= rtol * std::abs(double(want[i])) + atol))
      return ::testing::AssertionFailure() << "at " << i << ": got " << got[i] << ", want "
                                           << want[i] << " (rank " << world().rank() << " of "
                                           << world().size() << ")";
  }
  return ::testing::AssertionSuccess();
}

// max |got - want| <= rtol * max |want| (norm-wise: a sum of partial products over the ranks
// rounds differently from one GEMM's, which matters only against the row's magnitude).
::testing::AssertionResult close_normwise(const std::vector<float>& got,
                                          const std::vector<float>& want, double rtol) {
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(double(w)));
  return close(got, want, 0, rtol * scale);
}

// Every rank's copy of `v` is the same bits as rank 0's.
bool same_on_every_rank(const std::vector<float>& v) {
  Communicator& w = world();
  std::vector<float> all(v.size() * static_cast<size_t>(w.size()));
  w.all_gather(v.data(), all.data(), std::vector<int64_t>(static_cast<size_t>(w.size()),
                                                          static_cast<int64_t>(v.size())),
               sizeof(float));
  for (size_t i = 0; i < all.size(); ++i)
    if (std::memcmp(&all[i], &v[i % v.size()], sizeof(float)) != 0) return false;
  return true;
}

TEST(TensorGroup, SumsInRankOrderMaximaAndGathersAreTheSameOnEveryRank) {
  CommunicatorTensorGroup g(world());
  const int T = g.size(), me = g.rank();
  EXPECT_EQ(T, world().size());
  // Values whose sum depends on the order: rank q's element i.
  auto value = [](int q, int i) { return (q % 2 ? -1.0 : 1.0) * std::pow(10.0, (i + 3 * q) % 17) / (3 + q); };
  std::vector<double> d(9);
  std::vector<float> f(9), m(9);
  for (int i = 0; i < 9; ++i) {
    d[size_t(i)] = value(me, i);
    f[size_t(i)] = static_cast<float>(value(me, i));
    m[size_t(i)] = static_cast<float>((i * 7 + me * 5) % 11) - 5.0f;
  }
  g.all_reduce_sum(std::span<double>(d));
  g.all_reduce_sum(std::span<float>(f));
  g.all_reduce_max(m);
  for (int i = 0; i < 9; ++i) {
    double want = value(0, i);
    float fwant = static_cast<float>(value(0, i)), mwant = float((i * 7) % 11) - 5.0f;
    for (int q = 1; q < T; ++q) {
      want += value(q, i);
      fwant += static_cast<float>(value(q, i));
      mwant = std::max(mwant, float((i * 7 + q * 5) % 11) - 5.0f);
    }
    EXPECT_EQ(d[size_t(i)], want) << i;
    EXPECT_EQ(f[size_t(i)], fwant) << i;
    EXPECT_EQ(m[size_t(i)], mwant) << i;
  }
  const std::vector<float> in = {float(me), float(10 * me)};
  std::vector<float> out(2 * size_t(T));
  g.all_gather(in, out);
  for (int q = 0; q < T; ++q) {
    EXPECT_EQ(out[2 * size_t(q)], float(q));
    EXPECT_EQ(out[2 * size_t(q) + 1], float(10 * q));
  }
  std::vector<float> wrong(1);
  EXPECT_THROW(g.all_gather(in, wrong), Error);  // refused before any collective
}

// The group's collectives a few elements at a time (chunks of 8 floats: sums cut into many
// all-reduces, gathers of 2 or 4 values a rank, a reduce-scatter's parts packed) give the bits of
// the whole collective, in place too; lent from a pool, the buffers are Category::comm and
// tensor_group_buffer_bytes counts them.
TEST(TensorGroup, ChunksGiveTheWholeCollectivesBits) {
  const int T = world().size(), me = world().rank();
  MemoryPool pool;  // outlives the group's buffers
  CommunicatorTensorGroup whole(world()), chunked(world(), 8);
  chunked.lend_buffers(pool, true, 1000);
  EXPECT_EQ(static_cast<int64_t>(pool.current_breakdown()[static_cast<size_t>(Category::comm)]),
            T > 1 ? 2 * static_cast<int64_t>(MemoryPool::round_up(
                            static_cast<size_t>(std::max(8 / T * T, T)) * 4))
                  : 0);
  EXPECT_EQ(tensor_group_buffer_bytes(1, true, 1 << 30), 0);
  EXPECT_EQ(tensor_group_buffer_bytes(2, false, 1 << 30), 4 << 20);  // a chunk of 4 MiB
  EXPECT_EQ(tensor_group_buffer_bytes(2, true, 1 << 30), 8 << 20);
  // A smaller model's largest collective: its own size, rounded up to the ranks.
  EXPECT_EQ(tensor_group_buffer_bytes(4, false, 1001),
            static_cast<int64_t>(MemoryPool::round_up(1004 * 4)));
  auto value = [](int q, int i) {
    return static_cast<float>((q % 2 ? -1.0 : 1.0) * std::pow(10.0, (i + 3 * q) % 13) / (3 + q));
  };
  const int n = 37 * T;  // not a multiple of the chunk
  std::vector<float> a(static_cast<size_t>(n)), m(static_cast<size_t>(n));
  std::vector<double> d(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    a[size_t(i)] = value(me, i);
    m[size_t(i)] = value(me, 2 * i);
    d[size_t(i)] = value(me, 3 * i) / 7.0;
  }
  std::vector<float> a1 = a, a2 = a, m1 = m, m2 = m, rs1(size_t(n / T)), rs2 = a;
  std::vector<double> d1 = d, d2 = d;
  whole.all_reduce_sum(std::span<float>(a1));
  chunked.all_reduce_sum(std::span<float>(a2));
  whole.all_reduce_max(m1);
  chunked.all_reduce_max(m2);
  whole.all_reduce_sum(std::span<double>(d1));
  chunked.all_reduce_sum(std::span<double>(d2));
  whole.reduce_scatter_sum(a, rs1);
  // In place: the rank's part of the input is its output.
  const std::span<float> mine(rs2.data() + size_t(me) * rs1.size(), rs1.size());
  chunked.reduce_scatter_sum(rs2, mine);
  EXPECT_EQ(0, std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), m1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(rs1.data(), mine.data(), rs1.size() * sizeof(float)));
  EXPECT_EQ(whole.volume().all_reduce_count, chunked.volume().all_reduce_count);
  EXPECT_EQ(whole.volume().gathered_bytes, chunked.volume().gathered_bytes);
  EXPECT_EQ(whole.volume().reduce_scatter_count, chunked.volume().reduce_scatter_count);
}

// Loss and gradient of this rank's vocabulary slice against the plain kernel on whole rows.
// `comm` is the tensor group; `seed` differs between groups (the data replicas of a grid).
void check_vocab_parallel(int64_t R, int64_t V, int64_t align, bool masked,
                          Communicator& comm, uint32_t seed = 7) {
  CommunicatorTensorGroup g(comm);
  MemoryPool pool;
  const VocabShard shard = vocab_shard(V, g.size(), g.rank(), align);
  const int64_t Vp = shard.width * g.size();
  Tensor whole = random_tensor(pool, {R, Vp}, seed, 80.0f, 100.0f);
  Tensor targets = make(pool, {R}, DType::i32), mask = make(pool, {R}, DType::u8);
  std::mt19937 gen(8);
  for (int64_t r = 0; r < R; ++r) {
    targets.data<int32_t>()[r] = static_cast<int32_t>(gen() % static_cast<uint32_t>(V));
    mask.data<uint8_t>()[r] = r % 4 != 2;
  }
  if (R > 1) targets.data<int32_t>()[1] = static_cast<int32_t>(V - 1);  // the last real entry
  const Tensor* m = masked ? &mask : nullptr;
  const float dloss = 1.0f / static_cast<float>(R);

  Tensor mine = columns(pool, whole, shard.begin, shard.width);
  Tensor mine_fwd = columns(pool, whole, shard.begin, shard.width);
  Tensor losses = make(pool, {R}), losses_fwd = make(pool, {R});
  vocab_parallel_crossentropy_forward(g, losses_fwd, mine_fwd, targets, shard.begin, V, m);
  vocab_parallel_crossentropy_forward_backward(g, losses, mine, targets, shard.begin, V, dloss,
                                               DType::f32, m);

  Tensor want_losses = make(pool, {R});
  kernels::crossentropy_forward_backward(want_losses, whole, targets, V, dloss, DType::f32, m);
  const std::string at = "V " + std::to_string(V) + " over " + std::to_string(g.size()) +
                         " ranks, rank " + std::to_string(g.rank());
  EXPECT_TRUE(close(floats(losses), floats(want_losses), 1e-6)) << at;
  EXPECT_EQ(floats(losses), floats(losses_fwd)) << at;
  if (&comm == &world()) {
    EXPECT_TRUE(same_on_every_rank(floats(losses))) << at;
  }
  EXPECT_TRUE(close(floats(mine), floats(columns(pool, whole, shard.begin, shard.width)), 1e-6,
                    1e-12)) << at;
  if (g.size() == 1) {  // one rank holds the whole vocabulary: the plain kernel's bits
    EXPECT_EQ(floats(losses), floats(want_losses)) << at;
    EXPECT_EQ(floats(mine), floats(columns(pool, whole, 0, shard.width))) << at;
  }
  for (int64_t r = 0; r < R; ++r)  // this rank's padding columns: gradient 0
    for (int64_t j = shard.real; j < shard.width; ++j)
      EXPECT_EQ(mine.data<float>()[r * shard.width + j], 0.0f) << at;
}

TEST(VocabParallelCrossEntropy, MatchesThePlainKernelOnLargeLogits) {
  check_vocab_parallel(6, 1003, 1, false, world());  // 1003: no rank count above 1 divides it
  check_vocab_parallel(5, 4099, 64, true, world());  // padded to ranks * 64, loss-masked rows
  check_vocab_parallel(3, 5, 2, false, world());     // 4 ranks: the last slice is all padding
}

// As a run would: the tensor group of a data x tensor grid (a split communicator), each data
// replica with rows of its own; each group's loss is its own rows' whatever the other group does.
TEST(VocabParallelCrossEntropy, OverEachTensorGroupOfAGrid) {
  Communicator& w = world();
  for (int tensor = 1; tensor <= w.size(); ++tensor) {
    if (w.size() % tensor != 0) continue;
    const ProcessGrid grid(w, GridShape{w.size() / tensor, 1, tensor});
    check_vocab_parallel(4, 1003, 8, true, grid.tensor(),
                         100 + static_cast<uint32_t>(grid.coords().data));
  }
}

// A (out, in) weight and its pieces: rows [r0, r0 + n) or columns [c0, c0 + n).
Tensor rows(MemoryPool& pool, const Tensor& t, int64_t r0, int64_t n) {
  const int64_t cols = t.numel() / t.size(0);
  Tensor out = make(pool, t.rank() == 1 ? Shape{n} : Shape{n, cols});
  std::copy_n(t.data<float>() + r0 * cols, n * cols, out.data<float>());
  return out;
}

struct Linear {  // the one-process layer and its gradients
  Tensor x, w, b, dy, y, dx, dw, db;
};

Linear plain_linear(MemoryPool& pool, int64_t R, int64_t IC, int64_t OC) {
  Linear l;
  l.x = random_tensor(pool, {R, IC}, 21, -1, 1);
  l.w = random_tensor(pool, {OC, IC}, 22, -0.5, 0.5);
  l.b = random_tensor(pool, {OC}, 23, -1, 1);
  l.dy = random_tensor(pool, {R, OC}, 24, -1, 1);
  l.y = make(pool, {R, OC});
  l.dx = make(pool, {R, IC});
  l.dw = random_tensor(pool, {OC, IC}, 25, -1, 1);  // += : a gradient already there
  l.db = random_tensor(pool, {OC}, 26, -1, 1);
  kernels::matmul_forward(l.y, l.x, l.w, l.b);
  kernels::matmul_backward(l.dx, l.dw, l.db, l.dy, l.x, l.w);
  return l;
}

TEST(ParallelLinear, ColumnParallelMatchesThePlainLinear) {
  CommunicatorTensorGroup g(world());
  MemoryPool pool;
  const int64_t R = 7, IC = 40, OC = 48;  // OC / T features a rank, T in {1, 2, 4}
  const Linear l = plain_linear(pool, R, IC, OC);
  const int64_t n = OC / g.size(), o0 = n * g.rank();
  Tensor w = rows(pool, l.w, o0, n), b = rows(pool, l.b, o0, n);
  Tensor y = make(pool, {R, n}), dx = make(pool, {R, IC});
  Tensor dw = rows(pool, random_tensor(pool, {OC, IC}, 25, -1, 1), o0, n);
  Tensor db = rows(pool, random_tensor(pool, {OC}, 26, -1, 1), o0, n);
  column_parallel_linear_forward(y, l.x, w, b);
  Tensor dy = columns(pool, l.dy, o0, n);
  column_parallel_linear_backward(g, dx, dw, db, dy, l.x, w);
  EXPECT_TRUE(close_normwise(floats(y), floats(columns(pool, l.y, o0, n)), 1e-6));
  EXPECT_TRUE(close_normwise(floats(dx), floats(l.dx), 1e-6));
  EXPECT_TRUE(same_on_every_rank(floats(dx)));
  EXPECT_TRUE(close_normwise(floats(dw), floats(rows(pool, l.dw, o0, n)), 1e-6));
  EXPECT_TRUE(close_normwise(floats(db), floats(rows(pool, l.db, o0, n)), 1e-6));
}

TEST(ParallelLinear, RowParallelMatchesThePlainLinear) {
  CommunicatorTensorGroup g(world());
  MemoryPool pool;
  const int64_t R = 7, IC = 48, OC = 40;  // IC / T input features a rank
  const Linear l = plain_linear(pool, R, IC, OC);
  const int64_t n = IC / g.size(), i0 = n * g.rank();
  Tensor w = columns(pool, l.w, i0, n), x = columns(pool, l.x, i0, n);
  Tensor y = make(pool, {R, OC}), dx = make(pool, {R, n});
  Tensor dw = columns(pool, random_tensor(pool, {OC, IC}, 25, -1, 1), i0, n);
  Tensor db = random_tensor(pool, {OC}, 26, -1, 1);
  row_parallel_linear_forward(g, y, x, w, l.b);
  row_parallel_linear_backward(dx, dw, db, l.dy, x, w);
  EXPECT_TRUE(close_normwise(floats(y), floats(l.y), 1e-6));
  EXPECT_TRUE(same_on_every_rank(floats(y)));
  EXPECT_TRUE(close_normwise(floats(dx), floats(columns(pool, l.dx, i0, n)), 1e-6));
  EXPECT_TRUE(close_normwise(floats(dw), floats(columns(pool, l.dw, i0, n)), 1e-6));
  EXPECT_TRUE(close_normwise(floats(db), floats(l.db), 1e-6));
}

// Column then row (an MLP without its activation): one all-reduce each way, and the whole
// layer pair's output and input gradient as one process computes them.
TEST(ParallelLinear, ColumnThenRowIsThePlainPair) {
  CommunicatorTensorGroup g(world());
  MemoryPool pool;
  const int64_t R = 5, C = 24, H = 64;
  Tensor x = random_tensor(pool, {R, C}, 31, -1, 1), dy = random_tensor(pool, {R, C}, 32, -1, 1);
  Tensor w1 = random_tensor(pool, {H, C}, 33, -0.5, 0.5), w2 = random_tensor(pool, {C, H}, 34, -0.5, 0.5);
  Tensor none;
  Tensor h = make(pool, {R, H}), y = make(pool, {R, C}), dh = make(pool, {R, H}), dx = make(pool, {R, C});
  kernels::matmul_forward(h, x, w1, none);
  kernels::matmul_forward(y, h, w2, none);
  kernels::matmul_backward(dh, none, none, dy, h, w2);
  kernels::matmul_backward(dx, none, none, dh, x, w1);

  const int64_t n = H / g.size(), h0 = n * g.rank();
  Tensor w1p = rows(pool, w1, h0, n), w2p = columns(pool, w2, h0, n);
  Tensor hp = make(pool, {R, n}), yp = make(pool, {R, C}), dhp = make(pool, {R, n}),
         dxp = make(pool, {R, C});
  column_parallel_linear_forward(hp, x, w1p, none);
  row_parallel_linear_forward(g, yp, hp, w2p, none);
  row_parallel_linear_backward(dhp, none, none, dy, hp, w2p);
  column_parallel_linear_backward(g, dxp, none, none, dhp, x, w1p);
  EXPECT_TRUE(close_normwise(floats(yp), floats(y), 1e-6));
  EXPECT_TRUE(close_normwise(floats(dxp), floats(dx), 1e-6));
}

}  // namespace
}  // namespace memfit::dist
