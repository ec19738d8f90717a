// The memory timeline of a profile: the pool's account by category over time (from its event
// log) and, inside the activation and workspace arenas, the bytes of the buffers that held a
// live value (from the spans the step recorder observed). The trace, the page and the summary
// are views of it (Note [Memory profile], docs/notes/memory-profile.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/memory/category.h"
#include "memfit/memory/pool.h"
#include "memfit/profile/step_recorder.h"

namespace memfit::profile {

// The state from time t until the next sample's.
struct Sample {
  int64_t t = 0;          // nanoseconds since the run's start
  CategoryBytes pool{};   // the pool's account
  CategoryBytes live{};   // the same with each arena replaced by its buffers holding a live value
  size_t pool_total() const;
  size_t live_total() const;
};

// A buffer live at the peak: a pool allocation (a slab: params, grads, an optimizer moment,
// staging) or a buffer in an arena.
struct PeakBuffer {
  std::string tag;
  Category category;
  size_t bytes = 0;
  bool in_arena = false;
  std::string lifetime;  // "forward of block 3 -> backward of block 3", "from setup, held"
};

struct Timeline {
  int64_t begin = 0, end = 0;    // the profiled window (the samples start before it: setup)
  std::vector<Sample> samples;
  CategoryBytes arena{};         // each arena's slab (activations, workspace), 0 if none
  size_t pool_peak = 0;          // the pool's largest total over every sample
  int64_t pool_peak_t = 0;
  // The most bytes holding live values within the window, and when: the moment that explains
  // the memory a step needs.
  size_t live_peak = 0;
  int64_t live_peak_t = 0;
  size_t live_peak_sample = 0;
  int live_peak_run = -1;        // the phase run it falls in (-1: between phases)
  std::vector<PeakBuffer> peak_buffers;  // live at the live peak, largest first
  // The disk tier: the offload files' bytes by category (--offload-optimizer nvme; all zero
  // without). The files are made at setup and keep their size, so one value holds throughout.
  CategoryBytes disk{};
};

// Builds the timeline of a stopped recorder, the pool's events of the same run and the window
// [begin, end] (recorder times).
Timeline build_timeline(const StepRecorder& recorder, const std::vector<MemoryEvent>& events,
                        int64_t begin, int64_t end);

// "backward of block 3 (step 2, micro-batch 1)": a phase run as people read it.
std::string phase_run_name(const StepRecorder& recorder, int run);

}  // namespace memfit::profile
