#include "memfit/profile/leak_check.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace memfit::profile {

using nlohmann::json;

std::string format_bytes(double b) {
  const double a = std::abs(b);
  if (a < 10 * 1024.0) return fmt::format("{:.0f} B", b);
  if (a < 10 * 1024.0 * 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
}

int64_t LeakCheck::boundary(int64_t step, const MemoryPool& pool, size_t rss_bytes) {
  const std::vector<TagBytes> live = pool.live_by_tag();
  const size_t total = pool.bytes_current();
  const int64_t outside = static_cast<int64_t>(rss_bytes) - static_cast<int64_t>(total);
  const bool first = r_.boundaries == 0;
  ++r_.boundaries;
  r_.last_step = step;
  r_.last_bytes = total;
  r_.outside_last = outside;
  if (first) {
    r_.first_step = step;
    r_.first_bytes = r_.most_bytes = total;
    r_.outside_first = r_.outside_most = outside;
  }
  r_.most_bytes = std::max(r_.most_bytes, total);
  r_.outside_most = std::max(r_.outside_most, outside);
  for (auto& [key, e] : tags_) e.last = 0;  // a tag absent now holds nothing
  for (const TagBytes& t : live) {
    auto [it, added] = tags_.try_emplace({t.tag, t.category});
    Entry& e = it->second;
    if (added && first) e.first = t.bytes;
    e.last = t.bytes;
    e.most = std::max(e.most, t.bytes);
    if (!first && e.grew_after == 0 && t.bytes > e.first) e.grew_after = step;
  }
  return outside;
}

LeakReport LeakCheck::report() const {
  LeakReport r = r_;
  for (const auto& [key, e] : tags_)
    if (e.grew_after)
      r.grew.push_back({key.first, key.second, e.first, e.most, e.last, e.grew_after});
  std::stable_sort(r.grew.begin(), r.grew.end(), [](const LeakGrowth& a, const LeakGrowth& b) {
    return a.most_bytes - a.first_bytes > b.most_bytes - b.first_bytes;
  });
  return r;
}

json LeakReport::to_json() const {
  json g = json::array();
  for (const LeakGrowth& x : grew)
    g.push_back({{"tag", x.tag}, {"category", std::string(category_name(x.category))},
                 {"first_bytes", x.first_bytes}, {"most_bytes", x.most_bytes},
                 {"last_bytes", x.last_bytes}, {"first_grew_after_step", x.first_grew_after}});
  return {{"leaked", leaked()},
          {"first_step", first_step},
          {"last_step", last_step},
          {"boundaries", boundaries},
          {"live_bytes", {{"first", first_bytes}, {"last", last_bytes}, {"most", most_bytes}}},
          {"grew", std::move(g)},
          {"outside_pool_bytes",
           {{"first", outside_first}, {"last", outside_last}, {"most", outside_most}}}};
}

std::string LeakReport::text() const {
  std::string out;
  if (boundaries < 2) {
    out = fmt::format("leak check: {} step {}, nothing to compare\n", boundaries,
                      boundaries == 1 ? "boundary" : "boundaries");
  } else if (!leaked()) {
    out = fmt::format(
        "leak check: the pool's live bytes at the {} step boundaries after step {} never "
        "passed step {}'s ({})\n",
        boundaries - 1, first_step, first_step, format_bytes(static_cast<double>(first_bytes)));
  } else {
    out = fmt::format("leak check: the pool's live bytes grew by {} after step {} ({} B then, "
                      "{} B at most, {} B after step {}); what grew:\n",
                      format_bytes(static_cast<double>(most_bytes - first_bytes)), first_step,
                      first_bytes, most_bytes, last_bytes, last_step);
    for (const LeakGrowth& g : grew)
      out += fmt::format("  {} ({}): {} after step {}, {} at most, {} at the end; first grew "
                         "after step {}\n",
                         g.tag, category_name(g.category),
                         format_bytes(static_cast<double>(g.first_bytes)), first_step,
                         format_bytes(static_cast<double>(g.most_bytes)),
                         format_bytes(static_cast<double>(g.last_bytes)), g.first_grew_after);
  }
  if (boundaries > 0)
    out += fmt::format("resident outside the pool (RSS minus its account): {} after step {}, "
                       "{} after step {}, {} at most\n",
                       format_bytes(static_cast<double>(outside_first)), first_step,
                       format_bytes(static_cast<double>(outside_last)), last_step,
                       format_bytes(static_cast<double>(outside_most)));
  return out;
}

}  // namespace memfit::profile
