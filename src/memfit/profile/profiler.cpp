#include "memfit/profile/profiler.h"

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/kernels/kernel_times.h"
#include "memfit/memory/rss.h"
#include "memfit/profile/memory_page.h"
#include "memfit/profile/profile_summary.h"
#include "memfit/profile/timeline.h"
#include "memfit/profile/trace_export.h"

namespace memfit::profile {

namespace fs = std::filesystem;

Profiler::Profiler(const ProfileOptions& options, MemoryPool& pool,
                   std::chrono::steady_clock::time_point origin)
    : options_(options), pool_(pool), recorder_(origin) {
  if (options.steps < 1)
    MEMFIT_THROW(ConfigError, "train", "--profile-steps must be at least 1, got {}", options.steps);
  dir_ = options.dir;
  if (options.ranks > 1) dir_ /= fmt::format("rank{}", options.rank);
  made_.create(dir_, "train", "--profile " + options.dir);
  pool_.set_recording(true);
  pool_.set_phase("setup");
}

void Profiler::set_run(nlohmann::json run, std::optional<PlanReport> plan) {
  run_ = std::move(run);
  plan_ = std::move(plan);
}

void Profiler::step_begin(int64_t step) {
  if (finished_ || first_step_ >= 0) return;
  first_step_ = step;
  begin_ = recorder_.now();
  kernels::reset_kernel_times();
  kernels::record_kernel_times(true);
}

bool Profiler::step_end(int64_t step) {
  if (finished_ || first_step_ < 0 || step - first_step_ + 1 < options_.steps) return false;
  finish();
  return true;
}

void Profiler::finish() {
  if (finished_) return;
  finished_ = true;
  recorder_.stop();
  kernels::record_kernel_times(false);
  const int64_t end = recorder_.now();
  if (first_step_ < 0) begin_ = end;  // no step ran: the setup alone
  pool_.set_recording(false);
  const std::vector<MemoryEvent> events = pool_.events();
  Timeline tl = build_timeline(recorder_, events, begin_, end);
  tl.disk = disk_;

  SummaryInputs in;
  in.run = run_;
  in.plan = plan_ ? &*plan_ : nullptr;
  in.peak_by_category = pool_.peak_breakdown();
  in.events = events.size();
  in.events_dropped = pool_.events_dropped();
  in.rss_bytes = process_rss_bytes();
  in.pool_bytes = pool_.bytes_current();
  if (first_step_ >= 0) in.kernels = kernels::kernel_times();
  const nlohmann::json summary = summary_json(recorder_, tl, in);
  pool_.clear_events();  // the log's memory goes back now, not at the run's end

  std::string title = run_.value("title", std::string("memfit memory profile"));
  io::write_file_atomic(dir_ / "trace.json",
                        trace_json(recorder_, events, tl, options_.rank).dump());
  io::write_file_atomic(dir_ / "memory.html",
                        memory_page_html(page_data(recorder_, tl, summary, title)));
  io::write_file_atomic(dir_ / "summary.json", summary.dump(1));
  text_ = summary_text(summary, (dir_ / "{trace.json,memory.html,summary.json}").string());
}

}  // namespace memfit::profile
