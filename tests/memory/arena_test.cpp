// The offset assigner: buffers share bytes exactly where their lifetimes allow, holes are
// reused, the tighter of its two greedy orders is kept, pinned buffers keep their offsets, the
// result is deterministic, and on random inputs no two buffers whose lifetimes intersect ever
// overlap in bytes.
#include "memfit/memory/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "memfit/core/error.h"

namespace memfit {
namespace {

Lifetime span(int first, int last) { return {{{first, last}}}; }

TEST(Lifetime, OverlapsOnlyWhereSpansIntersect) {
  const Lifetime a{{{0, 1}, {5, 6}}}, b{{{2, 4}}}, c{{{4, 5}}};
  EXPECT_FALSE(a.overlaps(b));
  EXPECT_FALSE(b.overlaps(a));
  EXPECT_TRUE(a.overlaps(c));
  EXPECT_TRUE(b.overlaps(c));
  EXPECT_TRUE(a.live_at(6));
  EXPECT_FALSE(a.live_at(3));
}

TEST(Arena, DisjointLifetimesShareBytes) {
  const ArenaLayout l = assign_offsets({128, 64, 64}, {span(0, 1), span(2, 3), span(1, 2)});
  // The largest goes first at 0; the second does not meet it and shares 0; the third meets both.
  EXPECT_EQ(l.offsets, (std::vector<size_t>{0, 0, 128}));
  EXPECT_EQ(l.bytes, 192u);
}

TEST(Arena, FillsAHoleBetweenLiveBuffers) {
  // a (at 0) and d live throughout, b until phase 1: a at 0, b at 256, d above them at 320;
  // c (phases 2-3) takes b's bytes, the hole between a and d.
  const ArenaLayout l = assign_offsets({256, 64, 64, 64},
                                       {span(0, 3), span(0, 1), span(2, 3), span(0, 3)});
  EXPECT_EQ(l.offsets, (std::vector<size_t>{0, 256, 256, 320}));
  EXPECT_EQ(l.bytes, 384u);
  const ArenaLayout hole = assign_offsets({64, 64, 64, 64},
                                          {span(0, 3), span(0, 0), span(0, 3), span(1, 3)});
  // b at 64 dies after phase 0; d (phases 1-3) takes its place below c.
  EXPECT_EQ(hole.offsets, (std::vector<size_t>{0, 64, 128, 64}));
}

TEST(Arena, NeverOverlapsBuffersThatAreLiveTogether) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40), phases = 1 + static_cast<int>(rng() % 12);
    std::vector<size_t> bytes(n);
    std::vector<Lifetime> lifetimes(n);
    for (int i = 0; i < n; ++i) {
      bytes[i] = 64 * (1 + rng() % 8);
      // Spans of up to 3 phases with gaps of up to 3 between them.
      int p = static_cast<int>(rng() % phases);
      while (p < phases) {
        const int last = std::min(phases - 1, p + static_cast<int>(rng() % 3));
        lifetimes[i].spans.push_back({p, last});
        p = last + 1 + static_cast<int>(rng() % 4);
      }
    }
    const ArenaLayout l = assign_offsets(bytes, lifetimes);
    EXPECT_EQ(l.offsets, assign_offsets(bytes, lifetimes).offsets) << "not deterministic";
    size_t max_live = 0;
    for (int p = 0; p < phases; ++p) {
      size_t live = 0;
      for (int i = 0; i < n; ++i) live += lifetimes[i].live_at(p) ? bytes[i] : 0;
      max_live = std::max(max_live, live);
    }
    EXPECT_GE(l.bytes, max_live);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(l.offsets[i] % 64, 0u);
      EXPECT_LE(l.offsets[i] + bytes[i], l.bytes);
      for (int j = i + 1; j < n; ++j)
        if (lifetimes[i].overlaps(lifetimes[j])) {
          EXPECT_TRUE(l.offsets[i] + bytes[i] <= l.offsets[j] ||
                      l.offsets[j] + bytes[j] <= l.offsets[i])
              << "trial " << trial << ": buffers " << i << " and " << j << " overlap";
        }
    }
  }
}

TEST(Arena, TheLatestEndingFirstWhereThatPacksTighter) {
  // By size: d (192) at 0, b at 0 (d is dead by phase 3), a (meets d) at 192, c (meets a and b)
  // at 320: 448 bytes. By the latest end: b at 0, c above it at 192, a below c at 0, d between
  // at 128: 320, the most bytes live in a phase (phases 1 and 3).
  const ArenaLayout l =
      assign_offsets({128, 192, 128, 192}, {span(1, 2), span(3, 3), span(2, 3), span(0, 1)});
  EXPECT_EQ(l.offsets, (std::vector<size_t>{0, 0, 192, 128}));
  EXPECT_EQ(l.bytes, 320u);
}

TEST(Arena, PinnedBuffersKeepTheirOffsetsAndTheOthersFitAround) {
  // a pinned at 128 throughout; b (128, phases 0-1) fits below it; c (64, phases 2-3) shares
  // b's bytes; d (phases 1-2) meets all three and goes above a.
  const ArenaLayout l = assign_offsets({64, 128, 64, 64},
                                       {span(0, 3), span(0, 1), span(2, 3), span(1, 2)},
                                       {size_t{128}, std::nullopt, std::nullopt, std::nullopt});
  EXPECT_EQ(l.offsets, (std::vector<size_t>{128, 0, 0, 192}));
  EXPECT_EQ(l.bytes, 256u);
  // Pinned buffers share bytes only where their lifetimes are disjoint.
  EXPECT_NO_THROW(assign_offsets({64, 64}, {span(0, 1), span(2, 3)}, {size_t{0}, size_t{0}}));
  EXPECT_THROW(assign_offsets({64, 64}, {span(0, 2), span(2, 3)}, {size_t{0}, size_t{0}}), Error);
  EXPECT_THROW(assign_offsets({64}, {span(0, 0)}, {size_t{0}, size_t{64}}), Error);
}

TEST(Arena, ABufferThatIsNeverLiveIsAnError) {
  EXPECT_THROW(assign_offsets({64, 64}, {span(0, 0), Lifetime{}}), Error);
  EXPECT_THROW(assign_offsets({64}, {}), Error);
}

}  // namespace
}  // namespace memfit
