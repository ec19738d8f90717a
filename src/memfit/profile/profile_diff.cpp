#include "memfit/profile/profile_diff.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/memory/category.h"
#include "memfit/profile/profile_summary.h"

namespace memfit::profile {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Every field the diff reads, with its JSON type, so that a damaged summary.json is an error
// naming the file and the field, not a type error from deep in the diff.
void check_summary_shape(const json& j, const fs::path& file) {
  using T = json::value_t;
  auto expect = [&](const json& v, const std::string& where, bool ok, const char* what) {
    if (!ok)
      MEMFIT_THROW(ConfigError, "profile-diff", "{}: \"{}\" must be {}, got {}", file.string(),
                   where, what, v.dump().substr(0, 80));
  };
  auto object = [&](const json& v, const std::string& where) {
    expect(v, where, v.is_object(), "an object");
  };
  auto field = [&](const json& obj, const std::string& where, const char* key,
                   T type) -> const json& {
    const std::string at = where.empty() ? key : where + "." + key;
    if (!obj.contains(key))
      MEMFIT_THROW(ConfigError, "profile-diff", "{}: summary has no \"{}\"", file.string(), at);
    const json& v = obj[key];
    const bool ok = type == T::number_float ? v.is_number()
                    : type == T::object     ? v.is_object()
                    : type == T::array      ? v.is_array()
                                            : v.is_string();
    expect(v, at, ok,
           type == T::number_float ? "a number"
           : type == T::object     ? "an object"
           : type == T::array      ? "an array"
                                   : "a string");
    return v;
  };
  const json& root = j;
  field(root, "", "run", T::object);
  const json& measured = field(root, "", "measured", T::object);
  field(measured, "measured", "by_category", T::object);
  field(measured, "measured", "peak_bytes", T::number_float);
  const json& live = field(root, "", "live_peak", T::object);
  field(live, "live_peak", "by_category", T::object);
  field(live, "live_peak", "bytes", T::number_float);
  field(live, "live_peak", "where", T::string);
  const json& shares = field(field(root, "", "shares", T::object), "shares",
                             "at_live_peak", T::object);
  field(shares, "shares.at_live_peak", "activations_pct", T::number_float);
  field(shares, "shares.at_live_peak", "activations_over_params", T::number_float);
  for (const json& b : field(root, "", "buffers", T::array)) {
    object(b, "buffers[]");
    field(b, "buffers[]", "tag", T::string);
    field(b, "buffers[]", "bytes", T::number_float);
    field(b, "buffers[]", "category", T::string);
    if (b.contains("live_at_peak"))
      expect(b["live_at_peak"], "buffers[].live_at_peak", b["live_at_peak"].is_boolean(),
             "true or false");
  }
  for (const json& p : field(root, "", "phases", T::array)) {
    object(p, "phases[]");
    field(p, "phases[]", "kind", T::string);
    field(p, "phases[]", "live_bytes", T::number_float);
  }
}

}  // namespace

json load_summary(const fs::path& path, int rank) {
  fs::path file = path;
  if (fs::is_directory(path)) {
    // Rank r's profile under MPI; rank 0's is also the one of a run in one process.
    const fs::path ranked = path / fmt::format("rank{}", rank) / "summary.json";
    file = rank > 0 || (!fs::exists(path / "summary.json") && fs::exists(ranked))
               ? ranked
               : path / "summary.json";
  }
  if (!fs::exists(file))
    MEMFIT_THROW(IoError, "profile-diff",
                 "no profile at {}: expected {}, as memfit train --profile DIR writes "
                 "(DIR/rank<r>/ for each rank under MPI)",
                 path.string(), rank > 0 ? fmt::format("rank{}/summary.json", rank)
                                         : std::string("summary.json (or rank0/summary.json)"));
  json j;
  try {
    j = json::parse(io::read_file_to_string(file));
  } catch (const json::exception& e) {
    MEMFIT_THROW(ConfigError, "profile-diff", "{}: not valid JSON: {}", file.string(), e.what());
  }
  if (!j.is_object() || !j.contains("version") || !j["version"].is_number_integer())
    MEMFIT_THROW(ConfigError, "profile-diff", "{}: not a memfit profile summary (no \"version\")",
                 file.string());
  if (j["version"].get<int>() != kSummaryVersion)
    MEMFIT_THROW(ConfigError, "profile-diff",
                 "{}: summary version {}, this memfit reads version {}", file.string(),
                 j["version"].get<int>(), kSummaryVersion);
  check_summary_shape(j, file);
  return j;
}

namespace {

double num(const json& obj, const std::string& key) {
  return obj.is_object() && obj.contains(key) && obj[key].is_number() ? obj[key].get<double>() : 0.0;
}

struct Group {
  int count = 0;
  double bytes = 0, live = 0;
  std::string category;
};

std::map<std::string, Group> groups(const json& s) {
  std::map<std::string, Group> g;
  for (const json& b : s["buffers"]) {
    Group& x = g[tag_group(b["tag"].get<std::string>())];
    ++x.count;
    x.bytes += b["bytes"].get<double>();
    if (b.value("live_at_peak", false)) x.live += b["bytes"].get<double>();
    x.category = b["category"].get<std::string>();
  }
  return g;
}

// The most live bytes per kind of phase, the kinds in the order the step runs them.
std::vector<std::pair<std::string, double>> kind_max(const json& s) {
  std::vector<std::pair<std::string, double>> m;
  for (const json& p : s["phases"]) {
    const std::string k = p["kind"];
    auto it = std::find_if(m.begin(), m.end(), [&](const auto& e) { return e.first == k; });
    if (it == m.end()) it = m.insert(m.end(), {k, 0.0});
    it->second = std::max(it->second, p["live_bytes"].get<double>());
  }
  return m;
}

std::string describe(const json& run) {
  std::string s;
  for (const char* k : {"model", "batch", "seq_len", "precision", "ckpt", "attention", "optim"})
    if (run.contains(k)) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", k, run[k].dump());
  return s;
}

std::string signed_mib(double d) { return fmt::format("{}{}", d > 0 ? "+" : "", mib(d)); }

}  // namespace

json profile_diff_json(const json& a, const json& b) {
  json d;
  d["a"] = {{"run", a["run"]}};
  d["b"] = {{"run", b["run"]}};
  json cats = json::array();
  for (Category c : kAllCategories) {
    const std::string k(category_name(c));
    const double ma = num(a["measured"]["by_category"], k), mb = num(b["measured"]["by_category"], k);
    const double la = num(a["live_peak"]["by_category"], k), lb = num(b["live_peak"]["by_category"], k);
    if (ma == 0 && mb == 0 && la == 0 && lb == 0) continue;
    cats.push_back({{"category", k}, {"a", ma}, {"b", mb}, {"change", mb - ma},
                    {"live_a", la}, {"live_b", lb}});
  }
  d["categories"] = std::move(cats);
  d["peak"] = {{"a", num(a["measured"], "peak_bytes")}, {"b", num(b["measured"], "peak_bytes")}};
  d["live_peak"] = {{"a", a["live_peak"]}, {"b", b["live_peak"]}};
  d["shares"] = {{"a", a["shares"]["at_live_peak"]}, {"b", b["shares"]["at_live_peak"]}};
  json phases = json::array();
  const auto pa = kind_max(a), pb = kind_max(b);
  auto at = [](const auto& m, const std::string& k) {
    for (const auto& [kind, v] : m)
      if (kind == k) return v;
    return 0.0;
  };
  // B's order (it may add recomputation), then any kind only A has.
  std::vector<std::string> kinds;
  for (const auto* m : {&pb, &pa})
    for (const auto& [k, v] : *m)
      if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  for (const std::string& k : kinds)
    phases.push_back({{"kind", k}, {"a", at(pa, k)}, {"b", at(pb, k)}});
  d["phases"] = std::move(phases);
  json changed = json::array();
  const auto ga = groups(a), gb = groups(b);
  std::map<std::string, std::pair<Group, Group>> all;
  for (const auto& [k, g] : ga) all[k].first = g;
  for (const auto& [k, g] : gb) all[k].second = g;
  for (const auto& [k, ab] : all) {
    const auto& [x, y] = ab;
    if (x.count == y.count && x.bytes == y.bytes && x.live == y.live) continue;
    changed.push_back({{"group", k}, {"category", x.count ? x.category : y.category},
                       {"a_count", x.count}, {"a_bytes", x.bytes}, {"a_live", x.live},
                       {"b_count", y.count}, {"b_bytes", y.bytes}, {"b_live", y.live},
                       {"change", y.bytes - x.bytes}});
  }
  std::stable_sort(changed.begin(), changed.end(), [](const json& p, const json& q) {
    return std::abs(p["change"].get<double>()) > std::abs(q["change"].get<double>());
  });
  d["buffers"] = std::move(changed);
  return d;
}

std::string profile_diff_text(const json& d, const std::string& name_a, const std::string& name_b,
                              size_t top) {
  std::string out = fmt::format("A: {}\n   {}\nB: {}\n   {}\n\n", name_a, describe(d["a"]["run"]),
                                name_b, describe(d["b"]["run"]));
  out += fmt::format("{:<12} {:>12} {:>12} {:>12}   {:>12} {:>12}\n", "peak MiB", "A", "B",
                     "B - A", "live A", "live B");
  for (const json& c : d["categories"])
    out += fmt::format("{:<12} {:>12} {:>12} {:>12}   {:>12} {:>12}\n",
                       c["category"].get<std::string>(), mib(c["a"].get<double>()),
                       mib(c["b"].get<double>()), signed_mib(c["change"].get<double>()),
                       mib(c["live_a"].get<double>()), mib(c["live_b"].get<double>()));
  const json &la = d["live_peak"]["a"], &lb = d["live_peak"]["b"];
  out += fmt::format("{:<12} {:>12} {:>12} {:>12}   {:>12} {:>12}\n", "total",
                     mib(d["peak"]["a"].get<double>()), mib(d["peak"]["b"].get<double>()),
                     signed_mib(d["peak"]["b"].get<double>() - d["peak"]["a"].get<double>()),
                     mib(la["bytes"].get<double>()), mib(lb["bytes"].get<double>()));
  out += fmt::format("\nmost live bytes: A in {}, B in {}\n", la["where"].get<std::string>(),
                     lb["where"].get<std::string>());
  const json &sa = d["shares"]["a"], &sb = d["shares"]["b"];
  out += fmt::format("activations then: A {:.1f}% ({:.2f} x the parameters), B {:.1f}% ({:.2f} x)\n",
                     sa["activations_pct"].get<double>(), sa["activations_over_params"].get<double>(),
                     sb["activations_pct"].get<double>(), sb["activations_over_params"].get<double>());
  out += fmt::format("\n{:<22} {:>12} {:>12} {:>12}\n", "most live MiB in", "A", "B", "B - A");
  for (const json& p : d["phases"])
    out += fmt::format("{:<22} {:>12} {:>12} {:>12}\n", p["kind"].get<std::string>(),
                       mib(p["a"].get<double>()), mib(p["b"].get<double>()),
                       signed_mib(p["b"].get<double>() - p["a"].get<double>()));
  const json& bufs = d["buffers"];
  out += fmt::format("\nbuffers that changed ({} groups; * is a block number), largest change first:\n",
                     bufs.size());
  out += fmt::format("  {:<26} {:<11} {:>16} {:>16} {:>11}\n", "tag", "category", "A MiB (n)",
                     "B MiB (n)", "B - A");
  for (size_t i = 0; i < bufs.size() && i < top; ++i) {
    const json& b = bufs[i];
    out += fmt::format("  {:<26} {:<11} {:>16} {:>16} {:>11}\n", b["group"].get<std::string>(),
                       b["category"].get<std::string>(),
                       fmt::format("{} ({})", mib(b["a_bytes"].get<double>()), b["a_count"].get<int>()),
                       fmt::format("{} ({})", mib(b["b_bytes"].get<double>()), b["b_count"].get<int>()),
                       signed_mib(b["change"].get<double>()));
  }
  if (bufs.size() > top) out += fmt::format("  ... and {} more (--top to list them)\n", bufs.size() - top);
  return out;
}

}  // namespace memfit::profile
