#include "memfit/profile/trace_export.h"

#include <algorithm>

namespace memfit::profile {

using nlohmann::json;

namespace {

double us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

json meta(int pid, int tid, const char* what, const std::string& name) {
  json j = {{"ph", "M"}, {"pid", pid}, {"name", what}, {"args", {{"name", name}}}};
  if (tid >= 0) j["tid"] = tid;
  return j;
}

}  // namespace

json trace_json(const StepRecorder& rec, const std::vector<MemoryEvent>& events,
                const Timeline& tl, int rank) {
  const StepPlan& plan = rec.plan();
  json ev = json::array();
  ev.push_back(meta(1, -1, "process_name", fmt::format("memfit rank {}", rank)));
  ev.push_back(meta(1, 1, "thread_name", "trainer and step phases"));
  ev.push_back(meta(1, 2, "thread_name", "allocations"));
  ev.push_back(meta(2, -1, "process_name", fmt::format("memfit rank {} arena buffers", rank)));

  // Counters: one track per category that ever holds bytes, each point where it changes.
  CategoryBytes used{};
  for (const Sample& s : tl.samples)
    for (size_t c = 0; c < kNumCategories; ++c) used[c] |= s.pool[c];
  const Sample* prev = nullptr;
  auto counter = [&](const std::string& name, int64_t t, size_t bytes) {
    ev.push_back({{"ph", "C"}, {"pid", 1}, {"name", name}, {"ts", us(t)}, {"args", {{"bytes", bytes}}}});
  };
  for (const Sample& s : tl.samples) {
    for (Category c : kAllCategories) {
      const size_t i = static_cast<size_t>(c);
      if (!used[i]) continue;
      const std::string name(category_name(c));
      if (!prev || prev->pool[i] != s.pool[i]) counter("pool." + name, s.t, s.pool[i]);
      if ((c == Category::activations || c == Category::workspace) &&
          (!prev || prev->live[i] != s.live[i]))
        counter("live." + name, s.t, s.live[i]);
    }
    if (!prev || prev->pool_total() != s.pool_total()) counter("pool.total", s.t, s.pool_total());
    if (!prev || prev->live_total() != s.live_total()) counter("live.total", s.t, s.live_total());
    prev = &s;
  }
  // The disk tier (offload): a track per category of the files, flat from the first sample (the
  // files are made at setup) to the window's end.
  for (Category c : kAllCategories)
    if (const size_t b = tl.disk[static_cast<size_t>(c)]) {
      const std::string name = "disk." + std::string(category_name(c));
      counter(name, tl.samples.empty() ? tl.begin : std::min(tl.samples.front().t, tl.begin), b);
      counter(name, tl.end, b);
    }

  for (const SliceRun& s : rec.slices())
    ev.push_back({{"ph", "X"}, {"pid", 1}, {"tid", 1}, {"name", s.name},
                  {"cat", std::string(slice_kind_name(s.kind))}, {"ts", us(s.t0)},
                  {"dur", us(s.t1 - s.t0)}});
  const auto& runs = rec.phase_runs();
  for (size_t r = 0; r < runs.size(); ++r) {
    const MicroBatchRun& mb = rec.micro_batches()[static_cast<size_t>(runs[r].micro_batch)];
    ev.push_back({{"ph", "X"}, {"pid", 1}, {"tid", 1}, {"name", plan.phases[runs[r].phase].name()},
                  {"cat", "phase"}, {"ts", us(runs[r].t0)}, {"dur", us(runs[r].t1 - runs[r].t0)},
                  {"args", {{"phase", runs[r].phase}, {"step", mb.step}, {"training", mb.training}}}});
  }
  for (const MemoryEvent& e : events) {
    const bool alloc = e.kind == MemoryEvent::Kind::alloc;
    ev.push_back({{"ph", "i"}, {"s", "t"}, {"pid", 1}, {"tid", 2},
                  {"name", fmt::format("{} {}", alloc ? "alloc" : "free", e.tag)},
                  {"cat", alloc ? "alloc" : "free"}, {"ts", us(rec.from_steady_ns(e.ns))},
                  {"args", {{"tag", e.tag}, {"category", std::string(category_name(e.category))},
                            {"bytes", e.bytes}, {"total_after", e.total_after},
                            {"phase", e.phase}}}});
  }

  std::vector<bool> named(plan.buffers.size(), false);
  for (const BufferSpanRun& s : rec.spans()) {
    const BufferSpec& b = plan.buffers[s.buffer];
    const int tid = static_cast<int>(s.buffer) + 1;
    if (!named[s.buffer]) {
      named[s.buffer] = true;
      ev.push_back(meta(2, tid, "thread_name", b.tag));
      ev.push_back({{"ph", "M"}, {"pid", 2}, {"tid", tid}, {"name", "thread_sort_index"},
                    {"args", {{"sort_index", tid}}}});
    }
    ev.push_back({{"ph", "X"}, {"pid", 2}, {"tid", tid}, {"name", b.tag},
                  {"cat", std::string(category_name(b.category))}, {"ts", us(runs[s.first_run].t0)},
                  {"dur", us(runs[s.last_run].t1 - runs[s.first_run].t0)},
                  {"args", {{"bytes", b.bytes()},
                            {"from", plan.phases[runs[s.first_run].phase].name()},
                            {"to", plan.phases[runs[s.last_run].phase].name()}}}});
  }
  return {{"traceEvents", std::move(ev)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"producer", "memfit train --profile"},
            {"rank", rank},
            {"measured_peak_bytes", tl.pool_peak},
            {"live_peak_bytes", tl.live_peak},
            {"window_us", {us(tl.begin), us(tl.end)}}}}};
}

}  // namespace memfit::profile
