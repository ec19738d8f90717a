// What a running step tells an observer as it runs: each phase it enters, each buffer it uses and
// how, and the end of a micro-batch. The profiler (profile/step_recorder.h) turns this into the
// timeline's phase slices and the liveness of every buffer in the arenas, from what actually ran
// rather than from a second description of the step (Note [Memory profile],
// docs/notes/memory-profile.md). Planning contexts tell nobody.
#pragma once

#include <cstddef>

#include "memfit/model/step_schedule.h"

namespace memfit {

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Phase `index` of the running plan's phases begins; index 0 starts a new micro-batch.
  virtual void step_phase(int index) = 0;
  // The current phase uses plan.buffers[buffer]: `write` overwrites it (its old value is dead),
  // `read` needs the value an earlier phase left.
  virtual void step_use(size_t buffer, Access access) = 0;
  // The micro-batch's last phase (the embedding's backward) has ended.
  virtual void step_finish() = 0;
};

}  // namespace memfit
