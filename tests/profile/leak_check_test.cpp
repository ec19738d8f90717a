// The leak check: no growth when the step boundaries hold what the first held (slabs freed and
// allocated again included), a growing tag named with its category and the step after which it
// first grew, a tag new after the first step counted as growth, and RSS minus the pool.
#include "memfit/profile/leak_check.h"

#include <gtest/gtest.h>

namespace memfit {
namespace {

TEST(LeakCheck, SteadyBoundariesReportNoLeak) {
  MemoryPool pool;
  Allocation params = pool.allocate(4096, Category::params, "params");
  profile::LeakCheck check;
  for (int step = 1; step <= 5; ++step) {
    Allocation scratch = pool.allocate(1000, Category::workspace, "scratch");  // freed in the step
    scratch.release();
    Allocation again = pool.allocate(64, Category::staging, "batch");
    check.boundary(step, pool, 10000 + step);
  }
  const profile::LeakReport r = check.report();
  EXPECT_FALSE(r.leaked());
  EXPECT_EQ(r.boundaries, 5);
  EXPECT_EQ(r.first_bytes, 4096u + 64);  // the batch of the step is live at its boundary
  EXPECT_EQ(r.outside_first, 10001 - 4160);
  EXPECT_EQ(r.outside_last, 10005 - 4160);
  EXPECT_NE(r.text().find("never passed step 1's"), std::string::npos) << r.text();
}

TEST(LeakCheck, NamesTheTagsThatGrewAndWhen) {
  MemoryPool pool;
  Allocation params = pool.allocate(4096, Category::params, "params");
  std::vector<Allocation> held;
  profile::LeakCheck check;
  for (int step = 1; step <= 4; ++step) {
    if (step >= 3) held.push_back(pool.allocate(128, Category::workspace, "cache.rows"));
    if (step == 2) held.push_back(pool.allocate(64, Category::optimizer, "late.state"));
    check.boundary(step, pool, 0);
  }
  const profile::LeakReport r = check.report();
  ASSERT_TRUE(r.leaked());
  ASSERT_EQ(r.grew.size(), 2u);
  EXPECT_EQ(r.grew[0].tag, "cache.rows");  // the larger growth first
  EXPECT_EQ(r.grew[0].category, Category::workspace);
  EXPECT_EQ(r.grew[0].first_grew_after, 3);
  EXPECT_EQ(r.grew[0].last_bytes, 256u);
  EXPECT_EQ(r.grew[1].tag, "late.state");
  EXPECT_EQ(r.grew[1].first_grew_after, 2);
  const std::string text = r.text();
  for (const char* part : {"grew by", "cache.rows (workspace)", "late.state (optimizer)",
                           "first grew after step 3"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " not in:\n" << text;
  const nlohmann::json j = r.to_json();
  EXPECT_TRUE(j["leaked"]);
  EXPECT_EQ(j["grew"][0]["tag"], "cache.rows");
}

TEST(LeakCheck, OneBoundaryHasNothingToCompare) {
  MemoryPool pool;
  profile::LeakCheck check;
  check.boundary(7, pool, 0);
  EXPECT_FALSE(check.report().leaked());
  EXPECT_NE(check.report().text().find("nothing to compare"), std::string::npos);
}

}  // namespace
}  // namespace memfit
