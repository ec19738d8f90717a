#include "memfit/profile/step_recorder.h"

#include "memfit/core/error.h"

namespace memfit::profile {

std::string_view slice_kind_name(SliceKind kind) {
  switch (kind) {
    case SliceKind::step: return "step";
    case SliceKind::micro_batch: return "micro-batch";
    case SliceKind::data: return "data";
    case SliceKind::optimizer: return "optimizer";
    case SliceKind::evaluation: return "evaluation";
    case SliceKind::collective: return "collective";
    case SliceKind::save: return "save";
    case SliceKind::io_wait: return "io";
  }
  return "?";
}

StepRecorder::StepRecorder(std::chrono::steady_clock::time_point origin)
    : origin_(origin),
      origin_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(origin.time_since_epoch())
                     .count()) {}

int64_t StepRecorder::now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              origin_)
      .count();
}

int64_t StepRecorder::from_steady_ns(uint64_t ns) const {
  return static_cast<int64_t>(ns) - origin_ns_;
}

void StepRecorder::set_plan(const StepPlan& plan) {
  MEMFIT_CHECK(!batch_open_, "profile", "the step plan changed inside a micro-batch");
  MEMFIT_CHECK(runs_.empty() || (plan.phases == plan_.phases && plan.B == plan_.B &&
                                 plan.T == plan_.T && plan.buffers.size() == plan_.buffers.size()),
               "profile", "one profile records one step plan; the model reserved another");
  plan_ = plan;
  seen_in_run_.assign(plan_.buffers.size(), -1);
}

void StepRecorder::begin(std::string name, SliceKind kind) {
  if (!active_) return;
  const int64_t t = now();
  close_phase(t);
  slices_.push_back({std::move(name), kind, t, t, static_cast<int>(open_.size())});
  open_.push_back(slices_.size() - 1);
}

void StepRecorder::end() {
  if (!active_ || open_.empty()) return;
  const int64_t t = now();
  close_phase(t);
  // A micro-batch slice that ends ends its micro-batch (an evaluation's has no finish()).
  if (slices_[open_.back()].kind == SliceKind::micro_batch) close_micro_batch();
  slices_[open_.back()].t1 = t;
  open_.pop_back();
}

void StepRecorder::add(std::string name, SliceKind kind, std::chrono::steady_clock::time_point t0,
                       std::chrono::steady_clock::time_point t1) {
  if (!active_) return;
  auto at = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  };
  slices_.push_back({std::move(name), kind, at(t0), at(t1), static_cast<int>(open_.size())});
}

void StepRecorder::stop() {
  if (!active_) return;
  while (!open_.empty()) end();
  close_phase(now());
  close_micro_batch();
  active_ = false;
}

void StepRecorder::step_phase(int index) {
  if (!active_) return;
  const int64_t t = now();
  close_phase(t);
  if (index == 0) close_micro_batch();
  if (!batch_open_) {
    batches_.push_back({step_, false, static_cast<int>(runs_.size()), static_cast<int>(runs_.size())});
    batch_open_ = true;
  }
  const uint32_t at = static_cast<uint32_t>(uses_.size());
  runs_.push_back({index, t, t, static_cast<int>(batches_.size()) - 1, at, at});
  phase_open_ = true;
  const PhaseKind kind = plan_.phases.at(static_cast<size_t>(index)).kind;
  if (kind == PhaseKind::final_norm_backward || kind == PhaseKind::backward)
    batches_.back().training = true;
}

void StepRecorder::step_use(size_t buffer, Access access) {
  if (!active_ || !phase_open_) return;
  const int run = static_cast<int>(runs_.size()) - 1;
  if (seen_in_run_.at(buffer) == run) return;  // the phase's first use decides, as in planning
  seen_in_run_[buffer] = run;
  uses_.push_back({static_cast<uint32_t>(buffer), access});
  runs_.back().uses_end = static_cast<uint32_t>(uses_.size());
}

void StepRecorder::step_finish() {
  if (!active_) return;
  close_phase(now());
  close_micro_batch();
}

void StepRecorder::close_phase(int64_t t) {
  if (!phase_open_) return;
  runs_.back().t1 = t;
  phase_open_ = false;
}

// The spans of the micro-batch's buffers from its uses, as derive_lifetimes (step_plan.cpp) does
// from the planning record: a write opens a span, a read extends the buffer's last span. A read
// with no write before it in the micro-batch (none in a correct step) opens a span too, so it
// shows.
void StepRecorder::close_micro_batch() {
  if (!batch_open_) return;
  MicroBatchRun& mb = batches_.back();
  mb.end_run = static_cast<int>(runs_.size());
  std::vector<int> open(plan_.buffers.size(), -1);  // per buffer: its span in spans_
  for (int r = mb.first_run; r < mb.end_run; ++r) {
    for (uint32_t u = runs_[r].uses_begin; u < runs_[r].uses_end; ++u) {
      const BufferUse& use = uses_[u];
      int& span = open[use.buffer];
      if (use.access == Access::write || span < 0) {
        spans_.push_back({use.buffer, r, r});
        span = static_cast<int>(spans_.size()) - 1;
      } else {
        spans_[span].last_run = r;
      }
    }
  }
  batch_open_ = false;
}

size_t StepRecorder::bytes() const {
  size_t b = sizeof(*this) + runs_.capacity() * sizeof(PhaseRun) +
             uses_.capacity() * sizeof(BufferUse) + batches_.capacity() * sizeof(MicroBatchRun) +
             spans_.capacity() * sizeof(BufferSpanRun) + seen_in_run_.capacity() * sizeof(int);
  for (const SliceRun& s : slices_) b += sizeof(SliceRun) + s.name.capacity();
  return b;
}

}  // namespace memfit::profile
