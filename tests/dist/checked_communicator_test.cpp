// MEMFIT_CHECK_COLLECTIVES: matching collectives pass through unchanged; a divergent sequence
// (another kind, another size, one rank ending while another issues a collective) is a
// DisagreementError on every rank naming both records, instead of a hang, and the ranks can go
// on afterwards. The divergent cases need two ranks: `ctest -L dist-mpi` runs this file under
// mpirun -n 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memfit/dist/checked_communicator.h"

namespace memfit::dist {
namespace {

std::unique_ptr<Communicator> checked_world() {
  return make_checked_communicator(make_world_communicator());
}

// The message of the DisagreementError `f` throws ("" and a failure when it does not).
template <class F>
std::string disagreement(F&& f) {
  try {
    f();
  } catch (const DisagreementError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no DisagreementError";
  return "";
}

TEST(CheckedCommunicator, MatchingCollectivesPassThrough) {
  auto comm = checked_world();
  const int W = comm->size(), r = comm->rank();
  std::vector<float> x(8);
  for (int i = 0; i < 8; ++i) x[i] = float(r + 1) * float(i);
  comm->all_reduce(x);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(x[i], float(W * (W + 1) / 2) * float(i));
  std::vector<int64_t> counts(static_cast<size_t>(W), 2);
  std::vector<int32_t> mine = {r, r}, all(static_cast<size_t>(2 * W));
  comm->all_gather(mine.data(), all.data(), counts, sizeof(int32_t));
  for (int q = 0; q < W; ++q) EXPECT_EQ(all[static_cast<size_t>(2 * q)], q);
  int64_t v = r == 0 ? 42 : 0;
  comm->broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 42);
  comm->barrier();
  comm->end();
}

TEST(CheckedCommunicator, ADivergentSequenceFailsOnEveryRankNamingBothRecords) {
  auto comm = checked_world();
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks (ctest -L dist-mpi)";
  const int r = comm->rank();
  std::vector<float> x(16, 1.0f);
  std::vector<int64_t> counts(static_cast<size_t>(comm->size()), 4);
  std::vector<float> gathered(static_cast<size_t>(4 * comm->size()));
  // Another kind: rank 0 all-reduces, the others all-gather.
  std::string m = disagreement([&] {
    if (r == 0)
      comm->all_reduce(std::span<float>(x).first(8));
    else
      comm->all_gather(x.data(), gathered.data(), counts, sizeof(float));
  });
  EXPECT_NE(m.find("rank 0 issued collective 1: all_reduce of 8 x f32, rank 1 issued "
                   "collective 1: all_gather of " +
                   std::to_string(4 * comm->size()) + " x 4-byte elements"),
            std::string::npos)
      << m;
  // Another size.
  m = disagreement([&] { comm->all_reduce(std::span<float>(x).first(r == 0 ? 8 : 16)); });
  EXPECT_NE(m.find("rank 0 issued collective 2: all_reduce of 8 x f32, rank 1 issued "
                   "collective 2: all_reduce of 16 x f32"),
            std::string::npos)
      << m;
  // A rank that ends while another still issues one.
  m = disagreement([&] {
    if (r == 0)
      comm->barrier();
    else
      comm->end();
  });
  EXPECT_NE(m.find("rank 0 issued collective 3: barrier, rank 1 issued collective 3: none (the "
                   "end of its run)"),
            std::string::npos)
      << m;
  // Nothing was issued past the checks: the ranks go on together.
  std::fill(x.begin(), x.end(), 1.0f);
  comm->all_reduce(x);
  EXPECT_EQ(x[15], float(comm->size()));
}

// A split is agreed on like a collective (colors may differ), and its group is checked too.
TEST(CheckedCommunicator, ASplitIsCheckedAndMakesACheckedGroup) {
  auto comm = checked_world();
  const int r = comm->rank();
  std::unique_ptr<Communicator> half = comm->split(r % 2, r);
  EXPECT_NE(half->describe().find("MEMFIT_CHECK_COLLECTIVES"), std::string::npos)
      << half->describe();
  std::vector<float> x = {1.0f};
  half->all_reduce(x);
  EXPECT_EQ(x[0], float((comm->size() + 1 - r % 2) / 2));  // the ranks of r's parity
  if (comm->size() < 2) GTEST_SKIP() << "the divergent case needs two ranks (ctest -L dist-mpi)";
  const std::string m = disagreement([&] {
    if (r == 0)
      (void)comm->split(0, 0);
    else
      comm->barrier();
  });
  EXPECT_NE(m.find("rank 0 issued collective 2: split, rank 1 issued collective 2: barrier"),
            std::string::npos)
      << m;
}

TEST(CheckedCommunicator, TheFirstRankThatDiffersFromRankZeroIsReported) {
  CollectiveRecord a;
  a.seq = 3;
  a.kind = CollectiveRecord::all_reduce;
  a.count = 10;
  a.elem_bytes = 4;
  std::vector<CollectiveRecord> rs(4, a);
  EXPECT_EQ(first_divergent(rs.data(), 4), -1);
  rs[3].count = 11;
  rs[2].root = 1;
  EXPECT_EQ(first_divergent(rs.data(), 4), 2);
  EXPECT_EQ(rs[0].describe(), "collective 3: all_reduce of 10 x f32");
}

}  // namespace
}  // namespace memfit::dist
