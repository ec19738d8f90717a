// The leak check of `memfit train`: the pool's live bytes at each step boundary must not grow
// after the first step (which may still allocate, the optimizer's state for one). It compares
// every boundary's live bytes by tag and category with the first's and reports, at the end, the
// tags and categories that grew and after which step they first did (`--fail-on-leak` turns a
// growth into exit code 4). It also follows what the pool cannot see: the process's resident
// set minus the pool's account, at each boundary (libraries, the heap, fragmentation).
// Its memory is constant in the run's length: one entry per tag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/memory/pool.h"

namespace memfit::profile {

struct LeakGrowth {
  std::string tag;
  Category category;
  size_t first_bytes = 0;  // after the first step
  size_t most_bytes = 0;   // the most at any boundary after it
  size_t last_bytes = 0;   // at the last boundary
  int64_t first_grew_after = 0;  // the step after which it first held more than first_bytes
};

struct LeakReport {
  int64_t first_step = 0, last_step = 0;  // the boundaries compared (after these steps)
  int64_t boundaries = 0;
  size_t first_bytes = 0, last_bytes = 0, most_bytes = 0;  // the pool's live bytes
  std::vector<LeakGrowth> grew;  // largest growth first
  // The resident set minus the pool's account (signed: negative where RSS lags).
  int64_t outside_first = 0, outside_last = 0, outside_most = 0;

  bool leaked() const { return !grew.empty(); }
  nlohmann::json to_json() const;
  // "leak check: ..." lines for the end of the run.
  std::string text() const;
};

class LeakCheck {
 public:
  // At the end of step `step` (1-based): the pool's live bytes by tag and the process's
  // resident set (process_rss_bytes(), 0 where unknown). Returns RSS minus the pool's account.
  int64_t boundary(int64_t step, const MemoryPool& pool, size_t rss_bytes);
  LeakReport report() const;

 private:
  struct Entry {
    size_t first = 0, most = 0, last = 0;
    int64_t grew_after = 0;
  };
  LeakReport r_;
  std::map<std::pair<std::string, Category>, Entry> tags_;
};

// "4096 B", "12.0 KiB", "3.5 MiB".
std::string format_bytes(double bytes);

}  // namespace memfit::profile
