// Point to point (Communicator::send_async / recv_async), the pipeline stages' transport
// (Note [Pipeline parallel]), on whatever world runs the binary: alone (a rank sending to itself)
// and under `mpirun -n 2` and `-n 4` (ctest's dist_mpi_2ranks and dist_mpi_4ranks): a ring over
// the world, messages that keep their order, and neighbours along the pipeline axis of every
// grid that tiles the world. No ASSERT before a transfer another rank waits for.
#include "memfit/dist/communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/dist/process_grid.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

// What rank `from` sends as its message `k` (element i).
float payload(int from, int k, int64_t i) {
  return static_cast<float>(from * 1000 + k * 10) + static_cast<float>(i) * 0.25f;
}

TEST(PointToPoint, ARingDeliversEachRanksBytesToTheNext) {
  Communicator& w = world();
  const int W = w.size(), r = w.rank(), next = (r + 1) % W, prev = (r + W - 1) % W;
  const int64_t n = 1000;
  std::vector<float> out(n), in(n, -1.0f);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = payload(r, 0, i);
  // Both posted before either waits: neither rank blocks the other.
  auto s = w.send_async(out.data(), n * 4, next, 7);
  auto q = w.recv_async(in.data(), n * 4, prev, 7);
  q->wait();
  s->wait();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(in[static_cast<size_t>(i)], payload(prev, 0, i));
}

TEST(PointToPoint, MessagesWithOneTagArriveInTheOrderSentAndTagsKeepThemApart) {
  Communicator& w = world();
  const int W = w.size(), r = w.rank(), next = (r + 1) % W, prev = (r + W - 1) % W;
  const int64_t n = 64;
  std::vector<std::vector<float>> out(3, std::vector<float>(n));
  for (int k = 0; k < 3; ++k)
    for (int64_t i = 0; i < n; ++i) out[k][static_cast<size_t>(i)] = payload(r, k, i);
  // Messages 0 and 1 with tag 1, message 2 with tag 2; received tag 2 first.
  std::vector<std::unique_ptr<Request>> sends;
  sends.push_back(w.send_async(out[0].data(), n * 4, next, 1));
  sends.push_back(w.send_async(out[1].data(), n * 4, next, 1));
  sends.push_back(w.send_async(out[2].data(), n * 4, next, 2));
  std::vector<std::vector<float>> in(3, std::vector<float>(n));
  w.recv(in[2].data(), n * 4, prev, 2);
  w.recv(in[0].data(), n * 4, prev, 1);
  w.recv(in[1].data(), n * 4, prev, 1);
  for (auto& s : sends) s->wait();
  for (int k = 0; k < 3; ++k)
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(in[k][static_cast<size_t>(i)], payload(prev, k, i)) << "message " << k;
}

// Along the pipeline axis of each grid shape: stage s sends to stage s + 1, which answers with
// the values doubled (an activation forward, its gradient back), over the pipeline group.
TEST(PointToPoint, StagesOfEveryPipelineGroupExchangeWithTheirNeighboursOnly) {
  Communicator& w = world();
  const int W = w.size();
  for (int p = 1; p <= W; ++p) {
    if (W % p) continue;
    const GridShape shape{W / p, p, 1};
    ProcessGrid grid(w, shape);
    Communicator& pipe = grid.pipeline();
    const int s = grid.coords().pipeline;
    const int64_t n = 256;
    std::vector<float> x(n), back(n, -1.0f), got(n, -1.0f);
    if (s > 0) {
      pipe.recv(got.data(), n * 4, s - 1, 0);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(got[static_cast<size_t>(i)], payload(w.rank() - 1, 0, i)) << shape.describe();
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 2 * got[static_cast<size_t>(i)];
      pipe.send(x.data(), n * 4, s - 1, 1);
    }
    if (s + 1 < p) {
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = payload(w.rank(), 0, i);
      pipe.send(x.data(), n * 4, s + 1, 0);
      pipe.recv(back.data(), n * 4, s + 1, 1);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(back[static_cast<size_t>(i)], 2 * payload(w.rank(), 0, i)) << shape.describe();
    }
  }
}

TEST(PointToPoint, APeerOutsideTheGroupIsRefusedBeforeAnythingMoves) {
  float x = 0;
  EXPECT_THROW(world().send_async(&x, 4, world().size(), 0), DistError);
  EXPECT_THROW(world().recv_async(&x, 4, -1, 0), DistError);
}

TEST(PointToPoint, OneProcessRefusesAReceiveNothingWasSentFor) {
  auto one = make_single_communicator();
  float x = 1, y = 0;
  EXPECT_THROW(one->recv_async(&y, 4, 0, 3), DistError);  // would wait forever
  one->send(&x, 4, 0, 3);
  x = 5;  // copied at the send
  EXPECT_THROW(one->recv_async(&y, 8, 0, 3), DistError);  // sizes differ
  one->recv(&y, 4, 0, 3);
  EXPECT_EQ(y, 1.0f);
}

}  // namespace
}  // namespace memfit::dist
