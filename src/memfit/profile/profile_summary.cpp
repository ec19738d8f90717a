#include "memfit/profile/profile_summary.h"

#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

namespace memfit::profile {

using nlohmann::json;

namespace {

json by_category(const CategoryBytes& b) {
  json j = json::object();
  for (Category c : kAllCategories)
    if (b[static_cast<size_t>(c)]) j[std::string(category_name(c))] = b[static_cast<size_t>(c)];
  return j;
}

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// The largest live total while [t0, t1) lasts: the sample in force at t0 and those after it.
size_t max_live(const Timeline& tl, int64_t t0, int64_t t1) {
  const auto& s = tl.samples;
  auto it = std::upper_bound(s.begin(), s.end(), t0,
                             [](int64_t t, const Sample& x) { return t < x.t; });
  if (it != s.begin()) --it;
  size_t m = 0;
  for (; it != s.end() && (it->t < t1 || it->t == t0); ++it) m = std::max(m, it->live_total());
  return m;
}

double pct(size_t part, size_t whole) { return whole ? 100.0 * part / whole : 0.0; }

json shares(const CategoryBytes& b) {
  auto at = [&](Category c) { return b[static_cast<size_t>(c)]; };
  size_t total = 0;
  for (size_t x : b) total += x;
  const size_t params = at(Category::params) + at(Category::master);
  return {{"activations_pct", pct(at(Category::activations), total)},
          {"workspace_pct", pct(at(Category::workspace), total)},
          {"params_pct", pct(params, total)},
          {"grads_pct", pct(at(Category::grads), total)},
          {"optimizer_pct", pct(at(Category::optimizer), total)},
          {"other_pct", pct(at(Category::comm) + at(Category::staging), total)},
          {"activations_over_params",
           params ? static_cast<double>(at(Category::activations)) / params : 0.0}};
}

}  // namespace

std::string tag_group(const std::string& tag) {
  std::string out;
  size_t start = 0;
  while (start <= tag.size()) {
    size_t dot = tag.find('.', start);
    if (dot == std::string::npos) dot = tag.size();
    const std::string part = tag.substr(start, dot - start);
    const bool number = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    // A number between dots is a block (or a recomputation slot); a last part stays.
    out += (number && dot < tag.size()) ? "*" : part;
    if (dot < tag.size()) out += '.';
    start = dot + 1;
  }
  return out;
}

std::string mib(double bytes) { return fmt::format("{:.1f}", bytes / (1024.0 * 1024.0)); }

json kernels_json(const std::vector<kernels::KernelTime>& times, double per) {
  json out = json::array();
  for (const kernels::KernelTime& k : times) {
    json e = {{"name", k.name},
              {"calls", per == 1 ? json(k.calls) : json(double(k.calls) / per)},
              {"ms", k.seconds * 1e3 / per}};
    if (k.flops > 0 && k.seconds > 0) e["gflops_per_s"] = k.flops / k.seconds / 1e9;
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

// The buffers live at the peak (the top ones, then all with the arena's others) and their
// groups, into j: top_groups, top_buffers, buffers.
void buffers_json(const StepRecorder& rec, const Timeline& tl, json& j) {
  const StepPlan& plan = rec.plan();
  auto buffer_json = [](const PeakBuffer& b, bool live) {
    return json{{"tag", b.tag}, {"category", std::string(category_name(b.category))},
                {"bytes", b.bytes}, {"in_arena", b.in_arena}, {"live_at_peak", live},
                {"lifetime", b.lifetime}};
  };
  json top = json::array(), all = json::array();
  for (size_t i = 0; i < tl.peak_buffers.size(); ++i) {
    if (i < kTopBuffers) top.push_back(buffer_json(tl.peak_buffers[i], true));
    all.push_back(buffer_json(tl.peak_buffers[i], true));
  }
  // The arena's other buffers, with the lifetime the plan gives them.
  for (const BufferSpec& b : plan.buffers) {
    const bool listed = std::any_of(tl.peak_buffers.begin(), tl.peak_buffers.end(),
                                    [&](const PeakBuffer& p) { return p.in_arena && p.tag == b.tag; });
    if (listed || b.lifetime.spans.empty()) continue;
    const std::string first = plan.phases[b.lifetime.spans.front().first].name(),
                      last = plan.phases[b.lifetime.spans.back().last].name();
    all.push_back(buffer_json({b.tag, b.category, b.bytes(), true,
                               first == last ? first : first + " -> " + last},
                              false));
  }
  // The same by group, block numbers out: which operation's buffers take the most.
  std::map<std::pair<std::string, Category>, std::pair<size_t, int>> groups;
  for (const PeakBuffer& b : tl.peak_buffers) {
    auto& g = groups[{tag_group(b.tag), b.category}];
    g.first += b.bytes;
    ++g.second;
  }
  std::vector<json> by_group;
  for (const auto& [key, g] : groups)
    by_group.push_back({{"group", key.first}, {"category", std::string(category_name(key.second))},
                        {"bytes", g.first}, {"count", g.second}});
  std::stable_sort(by_group.begin(), by_group.end(), [](const json& a, const json& b) {
    return a["bytes"].get<size_t>() > b["bytes"].get<size_t>();
  });
  if (by_group.size() > kTopGroups) by_group.resize(kTopGroups);
  j["top_groups"] = by_group;
  j["top_buffers"] = std::move(top);
  j["buffers"] = std::move(all);
}

// Per phase of the plan: the most bytes live while a training micro-batch ran it, its mean
// time, and the plan's live bytes in it.
json phases_json(const StepRecorder& rec, const Timeline& tl, const SummaryInputs& in,
                 const CategoryBytes& planned_other) {
  const StepPlan& plan = rec.plan();
  const auto& runs = rec.phase_runs();
  // Per phase of the plan: the most bytes live while a training micro-batch ran it, its mean
  // time, and the plan's live bytes in it.
  json phases = json::array();
  for (size_t p = 0; p < plan.phases.size(); ++p) {
    size_t measured = 0;
    int64_t time = 0;
    int count = 0;
    for (const PhaseRun& r : runs) {
      if (r.phase != static_cast<int>(p) || !rec.micro_batches()[r.micro_batch].training) continue;
      measured = std::max(measured, max_live(tl, r.t0, r.t1));
      time += r.t1 - r.t0;
      ++count;
    }
    json ph = {{"name", plan.phases[p].name()},
               {"kind", phase_kind_name(plan.phases[p].kind)},
               {"layer", plan.phases[p].layer},
               {"live_bytes", measured},
               {"runs", count},
               {"mean_ms", count ? ms(time) / count : 0.0}};
    if (in.plan) {
      size_t other = 0;
      for (size_t b : planned_other) other += b;
      ph["planned_live_bytes"] = other + in.plan->step.live[p].total();
    }
    phases.push_back(std::move(ph));
  }
  return phases;
}

}  // namespace

json summary_json(const StepRecorder& rec, const Timeline& tl, const SummaryInputs& in) {
  const StepPlan& plan = rec.plan();
  const auto& runs = rec.phase_runs();
  json j;
  j["version"] = kSummaryVersion;
  j["run"] = in.run;
  j["measured"] = {{"peak_bytes", tl.pool_peak}, {"by_category", by_category(in.peak_by_category)}};
  CategoryBytes planned_other{};  // the plan's bytes outside the arenas
  if (in.plan) {
    j["planned"] = {{"peak_bytes", in.plan->peak_bytes},
                    {"by_category", by_category(in.plan->by_category)},
                    {"peak_phase", in.plan->peak_phase},
                    {"peak_live_bytes", in.plan->peak_live_bytes}};
    planned_other = in.plan->by_category;
    planned_other[static_cast<size_t>(Category::activations)] = 0;
    planned_other[static_cast<size_t>(Category::workspace)] = 0;
  } else {
    j["planned"] = nullptr;
  }
  // The disk tier (offload): the files' bytes against the plan's, by category; absent without.
  size_t disk_files = 0, disk_planned = 0;
  json disk = json::object();
  for (Category c : kAllCategories) {
    const size_t f = tl.disk[static_cast<size_t>(c)],
                 p = in.plan ? in.plan->disk_by_category[static_cast<size_t>(c)] : 0;
    if (!f && !p) continue;
    disk[std::string(category_name(c))] = {{"files", f}, {"planned", in.plan ? json(p) : json()}};
    disk_files += f;
    disk_planned += p;
  }
  if (!disk.empty())
    j["disk"] = {{"files_bytes", disk_files},
                 {"planned_bytes", in.plan ? json(disk_planned) : json()},
                 {"by_category", std::move(disk)}};

  const Sample peak = tl.samples.empty() ? Sample{} : tl.samples[tl.live_peak_sample];
  CategoryBytes arena_free{};
  for (Category c : {Category::activations, Category::workspace}) {
    const size_t i = static_cast<size_t>(c);
    arena_free[i] = peak.pool[i] - std::min(peak.pool[i], peak.live[i]);
  }
  std::string where = "between phases";
  if (tl.live_peak_run >= 0) {
    where = phase_run_name(rec, tl.live_peak_run);
  } else {
    for (const SliceRun& s : rec.slices())  // the innermost trainer slice then
      if (s.t0 <= tl.live_peak_t && tl.live_peak_t < s.t1) where = s.name;
  }
  j["live_peak"] = {{"bytes", tl.live_peak},
                    {"where", where},
                    {"phase", tl.live_peak_run >= 0
                                  ? plan.phases[runs[tl.live_peak_run].phase].name()
                                  : std::string()},
                    {"t_ms", ms(tl.live_peak_t)},
                    {"by_category", by_category(peak.live)},
                    {"arena_not_live", by_category(arena_free)}};

  buffers_json(rec, tl, j);

  j["phases"] = phases_json(rec, tl, in, planned_other);

  // The trainer's slices by kind: count, time, most bytes live.
  std::map<std::string, json> kinds;
  for (const SliceRun& s : rec.slices()) {
    json& k = kinds[std::string(slice_kind_name(s.kind))];
    if (k.is_null()) k = {{"count", 0}, {"total_ms", 0.0}, {"live_bytes", 0}};
    k["count"] = k["count"].get<int>() + 1;
    k["total_ms"] = k["total_ms"].get<double>() + ms(s.t1 - s.t0);
    k["live_bytes"] = std::max(k["live_bytes"].get<size_t>(), max_live(tl, s.t0, s.t1));
  }
  j["slices"] = kinds;

  j["shares"] = {{"at_live_peak", shares(peak.live)}, {"of_pool_peak", shares(in.peak_by_category)}};
  int64_t first = 0, last = 0;
  if (!rec.micro_batches().empty()) {
    first = rec.micro_batches().front().step;
    last = rec.micro_batches().back().step;
  }
  j["profile"] = {{"steps", {first, last}},
                  {"window_ms", {ms(tl.begin), ms(tl.end)}},
                  {"phase_runs", runs.size()},
                  {"micro_batches", rec.micro_batches().size()},
                  {"pool_events", in.events},
                  {"pool_events_dropped", in.events_dropped},
                  {"recorder_bytes", rec.bytes()}};
  j["outside_pool"] = {{"rss_bytes", in.rss_bytes},
                       {"pool_bytes", in.pool_bytes},
                       {"outside_pool_bytes",
                        static_cast<int64_t>(in.rss_bytes) - static_cast<int64_t>(in.pool_bytes)}};

  // Where the window's time went, kernel by kernel (self time; Note [Kernel times]).
  j["kernels"] = kernels_json(in.kernels);
  return j;
}

std::string summary_text(const json& s, const std::string& files) {
  std::string out = fmt::format("memfit profile: {}\n", files);
  const json& planned = s["planned"];
  const json& lp = s["live_peak"];
  out += fmt::format("peak {} MiB measured by the pool{}; the most bytes holding live values, "
                     "{} MiB, in {}\n\n",
                     mib(s["measured"]["peak_bytes"].get<double>()),
                     planned.is_null() ? std::string()
                                       : fmt::format(" ({} MiB planned)",
                                                     mib(planned["peak_bytes"].get<double>())),
                     mib(lp["bytes"].get<double>()), lp["where"].get<std::string>());
  out += fmt::format("{:<12} {:>13} {:>12} {:>15}\n", "category", "measured MiB", "planned MiB",
                     "live then MiB");
  auto get = [](const json& obj, const std::string& key) {
    return obj.is_object() && obj.contains(key) ? obj[key].get<double>() : 0.0;
  };
  for (Category c : kAllCategories) {
    const std::string k(category_name(c));
    const double m = get(s["measured"]["by_category"], k),
                 p = planned.is_null() ? 0.0 : get(planned["by_category"], k),
                 l = get(lp["by_category"], k);
    if (m == 0 && p == 0 && l == 0) continue;
    out += fmt::format("{:<12} {:>13} {:>12} {:>15}\n", k, mib(m),
                       planned.is_null() ? "-" : mib(p), mib(l));
  }
  out += fmt::format("{:<12} {:>13} {:>12} {:>15}\n", "total",
                     mib(s["measured"]["peak_bytes"].get<double>()),
                     planned.is_null() ? "-" : mib(planned["peak_bytes"].get<double>()),
                     mib(lp["bytes"].get<double>()));

  if (s.contains("disk")) {  // the disk tier: the offload files
    const json& d = s["disk"];
    auto cell = [](const json& b) { return b.is_null() ? std::string("-") : mib(b.get<double>()); };
    out += fmt::format("\n{:<12} {:>13} {:>12}\n", "on disk", "files MiB", "planned MiB");
    for (const auto& [k, v] : d["by_category"].items())
      out += fmt::format("{:<12} {:>13} {:>12}\n", k, cell(v["files"]), cell(v["planned"]));
    out += fmt::format("{:<12} {:>13} {:>12}\n", "total", cell(d["files_bytes"]),
                       cell(d["planned_bytes"]));
  }

  out += fmt::format("\ntop {} buffers live then:\n", s["top_buffers"].size());
  out += fmt::format("  {:>9}  {:<11}  {:<28}  {}\n", "MiB", "category", "tag", "lifetime");
  for (const json& b : s["top_buffers"])
    out += fmt::format("  {:>9}  {:<11}  {:<28}  {}\n", mib(b["bytes"].get<double>()),
                       b["category"].get<std::string>(), b["tag"].get<std::string>(),
                       b["lifetime"].get<std::string>());

  if (s.contains("top_groups")) {
    out += "\nthe same by group (* is a block number), largest first:\n";
    for (const json& g : s["top_groups"])
      out += fmt::format("  {:>9}  {:<11}  {:<28}  x{}\n", mib(g["bytes"].get<double>()),
                         g["category"].get<std::string>(), g["group"].get<std::string>(),
                         g["count"].get<int>());
  }

  // Phases grouped by kind, in the order they first run.
  out += "\nlive bytes per phase (the most over the profiled training micro-batches, MiB):\n";
  std::vector<std::string> order;
  std::map<std::string, std::vector<const json*>> by_kind;
  for (const json& p : s["phases"]) {
    const std::string k = p["kind"];
    if (!by_kind.count(k)) order.push_back(k);
    by_kind[k].push_back(&p);
  }
  for (const std::string& k : order) {
    const auto& list = by_kind[k];
    const json* top = list.front();
    double lo = 1e300;
    for (const json* p : list) {
      lo = std::min(lo, (*p)["live_bytes"].get<double>());
      if ((*p)["live_bytes"].get<double>() > (*top)["live_bytes"].get<double>()) top = p;
    }
    std::string line;
    if (list.size() == 1)
      line = fmt::format("{:<34} {:>9}", (*top)["name"].get<std::string>(),
                         mib((*top)["live_bytes"].get<double>()));
    else
      line = fmt::format("{:<34} {:>9} .. {} (most in block {})",
                         fmt::format("{} ({} blocks)", k, list.size()), mib(lo),
                         mib((*top)["live_bytes"].get<double>()), (*top)["layer"].get<int>());
    out += "  " + line + "\n";
  }
  for (const auto& [kind, k] : s["slices"].items())
    if (kind != "step" && kind != "micro-batch")
      out += fmt::format("  {:<34} {:>9} ({} x, {:.1f} ms in all)\n", kind,
                         mib(k["live_bytes"].get<double>()), k["count"].get<int>(),
                         k["total_ms"].get<double>());

  const json& sh = s["shares"]["at_live_peak"];
  out += fmt::format(
      "\nthen: activations {:.1f}%, workspace {:.1f}%, parameters {:.1f}%, gradients {:.1f}%, "
      "optimizer {:.1f}%, other {:.1f}%; activations = {:.2f} x the parameters\n",
      sh["activations_pct"].get<double>(), sh["workspace_pct"].get<double>(),
      sh["params_pct"].get<double>(), sh["grads_pct"].get<double>(),
      sh["optimizer_pct"].get<double>(), sh["other_pct"].get<double>(),
      sh["activations_over_params"].get<double>());
  const json& op = s["outside_pool"];
  out += fmt::format("resident outside the pool at the end of the profile: {} MiB (RSS {} MiB)\n",
                     mib(op["outside_pool_bytes"].get<double>()), mib(op["rss_bytes"].get<double>()));

  if (s.contains("kernels") && !s["kernels"].empty()) {
    const json& w = s["profile"]["window_ms"];
    const double window = w[1].get<double>() - w[0].get<double>();
    double total = 0;
    for (const json& k : s["kernels"]) total += k["ms"].get<double>();
    out += fmt::format("\ntime in kernels: {:.0f} ms of the {:.0f} ms profiled ({:.0f}%); the {} "
                       "slowest (self time; summary.json lists all):\n",
                       total, window, window > 0 ? 100 * total / window : 0.0,
                       std::min<size_t>(kTopKernels, s["kernels"].size()));
    out += fmt::format("  {:>9}  {:>6}  {:>7}  {:>8}  {}\n", "ms", "share", "calls", "GFLOP/s",
                       "kernel");
    size_t n = 0;
    for (const json& k : s["kernels"]) {
      if (n++ == kTopKernels) break;
      const double t = k["ms"].get<double>();
      out += fmt::format("  {:>9.1f}  {:>5.1f}%  {:>7}  {:>8}  {}\n", t,
                         window > 0 ? 100 * t / window : 0.0, k["calls"].get<int64_t>(),
                         k.contains("gflops_per_s")
                             ? fmt::format("{:.0f}", k["gflops_per_s"].get<double>())
                             : std::string(),
                         k["name"].get<std::string>());
    }
  }
  return out;
}

}  // namespace memfit::profile
