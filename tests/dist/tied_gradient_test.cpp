// The tied table's gradient sum at ZeRO 2-3 under --pp (dist/tied_gradient.h,
// tied_shard_pieces): each stage's data ranks hold shards of their own stage's layout, cut
// differently, so a first-stage rank exchanges with every last-stage rank the part of the table
// both own. Checked without MPI: the pieces of each side tile the table once, every piece has its
// mirror on the peer (the same elements of the table, the same count), peers are world ranks
// of the other stage at the same tensor index, and each side walks them in the order that
// leaves no cycle of waits.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/dist/tied_gradient.h"

namespace memfit::dist {
namespace {

struct Side {
  std::vector<ElementRange> shards;  // a stage's data shards of its layout
  ElementRange table;                // the table (first) or its copy (last) in that layout
};

TEST(TiedShardPieces, EachSideTilesTheTableAndEveryPieceHasItsMirror) {
  // The first stage: the table at the layout's start; the last: the copy after the tail.
  const Side first{{{0, 100}, {100, 260}, {260, 400}}, {0, 250}};
  const Side last{{{0, 180}, {180, 300}, {300, 500}}, {220, 470}};
  for (const int tp : {1, 2}) {
    const GridShape shape{3, 4, tp};
    // (peer world rank, my world rank) -> (table begin, count), for each side.
    std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> sent[2];
    for (int side = 0; side < 2; ++side) {
      const Side& me = side == 0 ? first : last;
      for (int t = 0; t < tp; ++t) {
        std::vector<bool> covered(250, false);
        for (int d = 0; d < 3; ++d) {
          const GridCoords at{d, side == 0 ? 0 : 3, t};
          const int64_t sums_begin = me.shards[static_cast<size_t>(d)].begin;
          const std::vector<TiedPiece> pieces = tied_shard_pieces(
              first.shards, last.shards, first.table, last.table, shape, at, sums_begin);
          int previous = -1;
          for (const TiedPiece& p : pieces) {
            const GridCoords peer = grid_coords(shape, p.peer);
            EXPECT_EQ(peer.pipeline, side == 0 ? 3 : 0);
            EXPECT_EQ(peer.tensor, t);
            EXPECT_GT(peer.data, previous);  // ascending: no cycle of waits
            previous = peer.data;
            ASSERT_GT(p.count, 0);
            // In this rank's sums, inside its shard and the table.
            const ElementRange in_layout{sums_begin + p.at, sums_begin + p.at + p.count};
            EXPECT_TRUE(me.shards[static_cast<size_t>(d)].contains(in_layout));
            EXPECT_TRUE(me.table.contains(in_layout));
            const int64_t table_at = in_layout.begin - me.table.begin;
            for (int64_t i = table_at; i < table_at + p.count; ++i) {
              EXPECT_FALSE(covered[static_cast<size_t>(i)]) << "element " << i << " twice";
              covered[static_cast<size_t>(i)] = true;
            }
            sent[side][{p.peer, grid_rank(shape, at)}] = {table_at, p.count};
          }
        }
        for (size_t i = 0; i < covered.size(); ++i)
          EXPECT_TRUE(covered[i]) << "side " << side << ", element " << i;
      }
    }
    // Every piece a first-stage rank exchanges with a last-stage rank is the one that rank
    // exchanges with it.
    EXPECT_EQ(sent[0].size(), sent[1].size());
    for (const auto& [ranks, piece] : sent[0]) {
      const auto mirror = sent[1].find({ranks.second, ranks.first});
      ASSERT_NE(mirror, sent[1].end());
      EXPECT_EQ(mirror->second, piece);
    }
  }
}

TEST(TiedShardPieces, RefusesAStageBetweenAndMismatchedTables) {
  const std::vector<ElementRange> shards{{0, 10}, {10, 20}};
  const GridShape shape{2, 3, 1};
  EXPECT_THROW(tied_shard_pieces(shards, shards, {0, 5}, {10, 15}, shape, {0, 1, 0}, 0), Error);
  EXPECT_THROW(tied_shard_pieces(shards, shards, {0, 5}, {10, 16}, shape, {0, 0, 0}, 0), Error);
}

}  // namespace
}  // namespace memfit::dist
