// The profiler's record of what ran: the trainer's slices (steps, micro-batches, data reads,
// the optimizer, evaluation, collectives, saves) and, as the running step tells it
// (model/step_observer.h), every phase with its start and end and every buffer each phase used.
// From the uses it derives each buffer's spans with the step plan's own rule (a write opens a
// span, a read extends it), so the liveness it reports is what the engine did, not what the
// plan says it would do (Note [Memory profile], docs/notes/memory-profile.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/model/step_observer.h"
#include "memfit/model/step_plan.h"

namespace memfit::profile {

// io_wait: the offloaded update waiting on the disk (its name, and the trace's cat, is "io").
enum class SliceKind : uint8_t {
  step, micro_batch, data, optimizer, evaluation, collective, save, io_wait
};
std::string_view slice_kind_name(SliceKind kind);

// Times are nanoseconds since the recorder's origin (the run's start).
struct SliceRun {
  std::string name;  // "step 2", "micro-batch 1", "optimizer", "data", "gradient all-reduce"
  SliceKind kind;
  int64_t t0 = 0, t1 = 0;
  int depth = 0;     // 0 for a step; nested slices one more than their parent
};

struct PhaseRun {
  int phase = 0;       // index into the plan's phases
  int64_t t0 = 0, t1 = 0;
  int micro_batch = 0; // index into micro_batches()
  uint32_t uses_begin = 0, uses_end = 0;  // its first use of each buffer, in uses()
};

struct BufferUse {
  uint32_t buffer;  // index into the plan's buffers
  Access access;
};

struct MicroBatchRun {
  int64_t step = 0;      // the optimizer step it belongs to (1-based)
  bool training = false; // it ran a backward (else: evaluation)
  int first_run = 0, end_run = 0;  // its phase runs [first_run, end_run)
};

// One value a buffer held: from the start of the phase run that wrote it to the end of the last
// phase run that read it.
struct BufferSpanRun {
  uint32_t buffer = 0;
  int first_run = 0, last_run = 0;  // indexes into phase_runs()
};

class StepRecorder final : public StepObserver {
 public:
  explicit StepRecorder(std::chrono::steady_clock::time_point origin);

  // The plan the observed context runs (Transformer::step_plan()), before its first phase.
  void set_plan(const StepPlan& plan);
  // The optimizer step (1-based) the next micro-batches belong to.
  void set_step(int64_t step) { step_ = step; }

  // A trainer slice; slices nest. Either call also ends the phase in progress: control is back
  // in the trainer.
  void begin(std::string name, SliceKind kind);
  void end();
  // A finished slice inside the open one (an offloaded update's wait on the disk, kept by the
  // optimizer and handed over after it): no phase is open then, so it ends none.
  void add(std::string name, SliceKind kind, std::chrono::steady_clock::time_point t0,
           std::chrono::steady_clock::time_point t1);
  // Ends every open slice and micro-batch; nothing is recorded after it.
  void stop();
  bool active() const { return active_; }

  // StepObserver.
  void step_phase(int index) override;
  void step_use(size_t buffer, Access access) override;
  void step_finish() override;

  int64_t now() const;
  // A std::chrono::steady_clock time in nanoseconds since its epoch (the pool's event times)
  // as a time of this record.
  int64_t from_steady_ns(uint64_t ns) const;

  const StepPlan& plan() const { return plan_; }
  const std::vector<SliceRun>& slices() const { return slices_; }
  const std::vector<PhaseRun>& phase_runs() const { return runs_; }
  const std::vector<BufferUse>& uses() const { return uses_; }
  const std::vector<MicroBatchRun>& micro_batches() const { return batches_; }
  const std::vector<BufferSpanRun>& spans() const { return spans_; }
  // The record's own memory: what profiling costs besides the pool's event log.
  size_t bytes() const;

 private:
  void close_phase(int64_t t);
  void close_micro_batch();

  std::chrono::steady_clock::time_point origin_;
  int64_t origin_ns_ = 0;
  StepPlan plan_;
  bool active_ = true;
  int64_t step_ = 0;
  std::vector<SliceRun> slices_;
  std::vector<size_t> open_;  // indexes of the open slices
  std::vector<PhaseRun> runs_;
  std::vector<BufferUse> uses_;
  std::vector<MicroBatchRun> batches_;
  std::vector<BufferSpanRun> spans_;
  std::vector<int> seen_in_run_;  // per buffer: the last phase run that used it
  bool phase_open_ = false, batch_open_ = false;
};

// A slice for the length of a scope; does nothing without a recorder (profiling off).
class Scope {
 public:
  Scope(StepRecorder* recorder, std::string name, SliceKind kind) : recorder_(recorder) {
    if (recorder_ && recorder_->active()) recorder_->begin(std::move(name), kind);
    else recorder_ = nullptr;
  }
  ~Scope() {
    if (recorder_ && recorder_->active()) recorder_->end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  StepRecorder* recorder_;
};

}  // namespace memfit::profile
