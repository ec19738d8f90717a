#include "memfit/profile/timeline.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "memfit/model/step_plan.h"

namespace memfit::profile {

namespace {

size_t sum(const CategoryBytes& b) {
  size_t t = 0;
  for (size_t x : b) t += x;
  return t;
}

bool is_arena(const MemoryEvent& e) { return e.tag == arena_tag(e.category); }

// A change of the live bytes at time t.
struct Delta {
  int64_t t;
  Category category;
  int64_t pool, live, arena;  // signed byte changes
};

}  // namespace

size_t Sample::pool_total() const { return sum(pool); }
size_t Sample::live_total() const { return sum(live); }

std::string phase_run_name(const StepRecorder& recorder, int run) {
  const PhaseRun& r = recorder.phase_runs().at(static_cast<size_t>(run));
  const MicroBatchRun& mb = recorder.micro_batches().at(static_cast<size_t>(r.micro_batch));
  // The micro-batch's number within its step, counted among those of the same kind.
  int n = 1;
  for (int i = r.micro_batch - 1; i >= 0; --i) {
    const MicroBatchRun& other = recorder.micro_batches()[static_cast<size_t>(i)];
    if (other.step != mb.step) break;
    n += other.training == mb.training;
  }
  return fmt::format("{} (step {}, {} {})", recorder.plan().phases[r.phase].name(), mb.step,
                     mb.training ? "micro-batch" : "evaluation batch", n);
}

Timeline build_timeline(const StepRecorder& rec, const std::vector<MemoryEvent>& events,
                        int64_t begin, int64_t end) {
  Timeline tl;
  tl.begin = begin;
  tl.end = end;
  const StepPlan& plan = rec.plan();
  const auto& runs = rec.phase_runs();

  std::vector<Delta> deltas;
  for (const MemoryEvent& e : events) {
    const int64_t sign = e.kind == MemoryEvent::Kind::alloc ? 1 : -1;
    const int64_t b = sign * static_cast<int64_t>(e.bytes);
    // An arena's bytes count as live only through its buffers' spans.
    deltas.push_back({rec.from_steady_ns(e.ns), e.category, b, is_arena(e) ? 0 : b,
                      is_arena(e) ? b : 0});
  }
  // A buffer's live bytes count in its arena's category: the gradient units in the activations
  // arena (Note [Gradients by lifetime]) are part of that arena's account.
  for (const BufferSpanRun& s : rec.spans()) {
    const BufferSpec& b = plan.buffers[s.buffer];
    const int64_t bytes = static_cast<int64_t>(b.bytes());
    const Category in = arena_category(b.category);
    deltas.push_back({runs[s.first_run].t0, in, 0, bytes, 0});
    deltas.push_back({runs[s.last_run].t1, in, 0, -bytes, 0});
  }
  std::stable_sort(deltas.begin(), deltas.end(),
                   [](const Delta& a, const Delta& b) { return a.t < b.t; });

  Sample now;
  CategoryBytes arena{};
  auto add = [](size_t& x, int64_t d) { x = static_cast<size_t>(static_cast<int64_t>(x) + d); };
  for (size_t i = 0; i < deltas.size();) {
    const int64_t t = deltas[i].t;
    for (; i < deltas.size() && deltas[i].t == t; ++i) {
      const size_t c = static_cast<size_t>(deltas[i].category);
      add(now.pool[c], deltas[i].pool);
      add(now.live[c], deltas[i].live);
      add(arena[c], deltas[i].arena);
      tl.arena[c] = std::max(tl.arena[c], arena[c]);
    }
    now.t = t;
    tl.samples.push_back(now);
  }

  for (size_t i = 0; i < tl.samples.size(); ++i) {
    const Sample& s = tl.samples[i];
    if (s.pool_total() > tl.pool_peak) {
      tl.pool_peak = s.pool_total();
      tl.pool_peak_t = s.t;
    }
    // Within the window; the sample in force at its start counts from the start.
    const bool in_window =
        s.t <= end && (s.t >= begin || i + 1 == tl.samples.size() || tl.samples[i + 1].t > begin);
    if (in_window && s.live_total() > tl.live_peak) {
      tl.live_peak = s.live_total();
      tl.live_peak_t = std::max(s.t, begin);
      tl.live_peak_sample = i;
    }
  }
  const int64_t tp = tl.live_peak_t;
  for (size_t r = 0; r < runs.size(); ++r)
    if (runs[r].t0 <= tp && tp < runs[r].t1) tl.live_peak_run = static_cast<int>(r);

  // What is live at the peak: the arena buffers whose span covers it, and the pool's
  // allocations made before it and not yet freed (paired by tag and category, last in first out).
  for (const BufferSpanRun& s : rec.spans()) {
    if (!(runs[s.first_run].t0 <= tp && tp < runs[s.last_run].t1)) continue;
    const BufferSpec& b = plan.buffers[s.buffer];
    const std::string first = plan.phases[runs[s.first_run].phase].name(),
                      last = plan.phases[runs[s.last_run].phase].name();
    tl.peak_buffers.push_back(
        {b.tag, b.category, b.bytes(), true, first == last ? first : first + " -> " + last});
  }
  std::map<std::pair<std::string, Category>, std::vector<const MemoryEvent*>> held;
  for (const MemoryEvent& e : events) {
    if (rec.from_steady_ns(e.ns) > tp) break;
    auto& stack = held[{e.tag, e.category}];
    if (e.kind == MemoryEvent::Kind::alloc) stack.push_back(&e);
    else if (!stack.empty()) stack.pop_back();
  }
  for (const auto& [key, stack] : held)
    for (const MemoryEvent* e : stack)
      if (!is_arena(*e))
        tl.peak_buffers.push_back({e->tag, e->category, e->bytes, false,
                                   fmt::format("from {}, held", e->phase.empty() ? "setup" : e->phase)});
  std::stable_sort(tl.peak_buffers.begin(), tl.peak_buffers.end(),
                   [](const PeakBuffer& a, const PeakBuffer& b) { return a.bytes > b.bytes; });
  return tl;
}

}  // namespace memfit::profile
