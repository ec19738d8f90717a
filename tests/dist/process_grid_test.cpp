// The grid's arithmetic (Megatron-LM's rank order, tensor fastest), and its groups on whatever
// world runs the binary: alone, and under `mpirun -n 2` and `-n 4` (ctest's dist_mpi_2ranks and
// dist_mpi_4ranks), where every grid that tiles the world is built and each of its groups must
// reduce among its own members only. Every rank runs the same tests in the same order: no ASSERT
// before a collective.
#include "memfit/dist/process_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "memfit/core/error.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

// Every shape of `ranks` ranks: each (data, pipeline, tensor) whose product is `ranks`.
std::vector<GridShape> shapes_of(int ranks) {
  std::vector<GridShape> shapes;
  for (int d = 1; d <= ranks; ++d)
    for (int p = 1; p <= ranks; ++p)
      for (int t = 1; t <= ranks; ++t)
        if (d * p * t == ranks) shapes.push_back({d, p, t});
  return shapes;
}

TEST(ProcessGrid, RanksAreMegatronsOrderTensorFastest) {
  const GridShape s{2, 3, 4};  // 24 ranks
  EXPECT_EQ(s.size(), 24);
  EXPECT_EQ(grid_rank(s, {0, 0, 0}), 0);
  EXPECT_EQ(grid_rank(s, {0, 0, 1}), 1);   // tensor neighbours are rank neighbours
  EXPECT_EQ(grid_rank(s, {0, 1, 0}), 4);   // the next pipeline stage, a tensor group later
  EXPECT_EQ(grid_rank(s, {1, 0, 0}), 12);  // the next data replica, a whole model later
  EXPECT_EQ(grid_rank(s, {1, 2, 3}), 23);
  for (int r = 0; r < s.size(); ++r) {
    const GridCoords c = grid_coords(s, r);
    EXPECT_EQ(grid_rank(s, c), r);
    EXPECT_EQ(r, ((c.data * s.pipeline) + c.pipeline) * s.tensor + c.tensor);
  }
  EXPECT_EQ(grid_coords(s, 17), (GridCoords{1, 1, 1}));
}

TEST(ProcessGrid, GroupsAreTheRanksThatDifferAlongOneAxis) {
  const GridShape s{2, 3, 4};
  EXPECT_EQ(group_ranks(s, Axis::tensor, 17), (std::vector<int>{16, 17, 18, 19}));
  EXPECT_EQ(group_ranks(s, Axis::pipeline, 17), (std::vector<int>{13, 17, 21}));
  EXPECT_EQ(group_ranks(s, Axis::data, 17), (std::vector<int>{5, 17}));
  // The groups along an axis tile the ranks, each rank in one, and its color is its group's.
  for (Axis a : kAxes) {
    std::vector<int> seen(static_cast<size_t>(s.size()), 0);
    for (int r = 0; r < s.size(); ++r) {
      const std::vector<int> g = group_ranks(s, a, r);
      EXPECT_EQ(static_cast<int>(g.size()), s.along(a));
      EXPECT_EQ(g[static_cast<size_t>(grid_coords(s, r).along(a))], r) << axis_name(a);
      for (int q : g) EXPECT_EQ(group_color(s, a, q), group_color(s, a, r)) << axis_name(a);
      if (g.front() == r)
        for (int q : g) ++seen[static_cast<size_t>(q)];
    }
    for (int n : seen) EXPECT_EQ(n, 1) << axis_name(a);
  }
  // Different groups, different colors.
  EXPECT_NE(group_color(s, Axis::data, 16), group_color(s, Axis::data, 17));
}

TEST(ProcessGrid, OutsideTheShapeIsADistError) {
  const GridShape s{2, 1, 2};
  EXPECT_THROW(grid_coords(s, 4), DistError);
  EXPECT_THROW(grid_coords(s, -1), DistError);
  EXPECT_THROW(grid_rank(s, {0, 1, 0}), DistError);
  EXPECT_THROW(grid_coords(GridShape{0, 1, 1}, 0), DistError);
  EXPECT_EQ(s.describe(), "2 data x 1 pipeline x 2 tensor");
}

TEST(ProcessGrid, AShapeOfAnotherSizeIsRefusedBeforeAnySplit) {
  Communicator& w = world();
  EXPECT_THROW({ ProcessGrid g(w, GridShape{w.size() + 1, 1, 1}); }, DistError);
  EXPECT_THROW({ ProcessGrid g(w, GridShape{w.size(), 0, 1}); }, DistError);
}

// Data parallelism only, as memfit trains: the data group is the world itself (the same
// object, so every collective is what it was), the others one process each.
TEST(ProcessGrid, DataOnlyIsTheWorld) {
  Communicator& w = world();
  const ProcessGrid grid(w);
  EXPECT_EQ(grid.shape(), (GridShape{w.size(), 1, 1}));
  EXPECT_EQ(&grid.data(), &w);
  EXPECT_EQ(&grid.world(), &w);
  EXPECT_EQ(grid.coords(), (GridCoords{w.rank(), 0, 0}));
  EXPECT_EQ(grid.tensor().size(), 1);
  EXPECT_EQ(grid.pipeline().size(), 1);
  EXPECT_EQ(grid.tensor().rank(), 0);
}

// Rank r contributes 1 << r to each group's all-reduce: the sum names exactly the members.
TEST(ProcessGrid, EveryGroupReducesWithinItself) {
  Communicator& w = world();
  for (const GridShape& s : shapes_of(w.size())) {
    const ProcessGrid grid(w, s);
    EXPECT_EQ(grid.coords(), grid_coords(s, w.rank()));
    for (Axis a : kAxes) {
      Communicator& g = grid.group(a);
      const std::vector<int> members = group_ranks(s, a, w.rank());
      EXPECT_EQ(g.size(), static_cast<int>(members.size())) << s.describe() << " " << axis_name(a);
      EXPECT_EQ(g.rank(), grid.coords().along(a));
      std::vector<float> x = {float(1 << w.rank()), 1.0f};
      g.all_reduce(x);
      int want = 0;
      for (int q : members) want += 1 << q;
      EXPECT_EQ(x[0], float(want)) << s.describe() << ", the " << axis_name(a) << " group";
      EXPECT_EQ(x[1], float(members.size()));
      // And gathers its members in group order.
      std::vector<int32_t> all(members.size());
      const int32_t mine = w.rank();
      g.all_gather(&mine, all.data(), std::vector<int64_t>(members.size(), 1), sizeof(int32_t));
      EXPECT_EQ(std::vector<int>(all.begin(), all.end()), members);
    }
  }
}

// The case by name: four ranks as 2 data x 2 tensor; ranks {0, 2} and {1, 3} are the
// data groups, {0, 1} and {2, 3} the tensor groups.
TEST(ProcessGrid, TwoByTwoGroupsSumOnlyTheirTwoMembers) {
  Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs four ranks (ctest's dist_mpi_4ranks)";
  const ProcessGrid grid(w, GridShape{2, 1, 2});
  const int r = w.rank();
  std::vector<float> d = {float(10 * (r + 1))};
  grid.data().all_reduce(d);
  EXPECT_EQ(d[0], r % 2 == 0 ? 10.0f + 30.0f : 20.0f + 40.0f);
  std::vector<float> t = {float(10 * (r + 1))};
  grid.tensor().all_reduce(t);
  EXPECT_EQ(t[0], r < 2 ? 10.0f + 20.0f : 30.0f + 40.0f);
  EXPECT_EQ(grid.pipeline().size(), 1);
}

// Any colors and keys: the ranks of one color form a group, numbered by key (here in reverse
// rank order), and a collective in it sums those ranks only.
TEST(Communicator, SplitGroupsTheRanksOfOneColorInKeyOrder) {
  Communicator& w = world();
  auto color_of = [](int r) { return (r * 5 + 3) % 3 * 7; };  // ranks 0-3: 0, 14, 7, 0
  std::unique_ptr<Communicator> g = w.split(color_of(w.rank()), -w.rank());
  std::vector<int> members;
  for (int q = w.size() - 1; q >= 0; --q)
    if (color_of(q) == color_of(w.rank())) members.push_back(q);
  EXPECT_EQ(g->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[static_cast<size_t>(g->rank())], w.rank());
  std::vector<float> x = {float(1 << w.rank())};
  g->all_reduce(x);
  int want = 0;
  for (int q : members) want += 1 << q;
  EXPECT_EQ(x[0], float(want));
  std::vector<int32_t> all(members.size());
  const int32_t mine = w.rank();
  g->all_gather(&mine, all.data(), std::vector<int64_t>(members.size(), 1), sizeof(int32_t));
  EXPECT_EQ(std::vector<int>(all.begin(), all.end()), members);
  // A group of one color for all is the world again, and splits further.
  std::unique_ptr<Communicator> all_of_them = w.split(0, w.rank());
  EXPECT_EQ(all_of_them->size(), w.size());
  EXPECT_EQ(all_of_them->rank(), w.rank());
  std::unique_ptr<Communicator> each = all_of_them->split(w.rank(), 0);
  EXPECT_EQ(each->size(), 1);
}

TEST(Communicator, SplitKeepsTheTimeoutAndRefusesANegativeColor) {
  Communicator& w = world();
  const double before = w.timeout();
  w.set_timeout(30);
  std::unique_ptr<Communicator> g = w.split(0, 0);
  w.set_timeout(before);
  EXPECT_EQ(g->timeout(), 30);
  EXPECT_THROW(w.split(-1, 0), DistError);  // on every rank alike, before any exchange
}

}  // namespace
}  // namespace memfit::dist
