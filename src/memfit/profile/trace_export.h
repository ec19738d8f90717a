// trace.json: a profile in the Chrome Trace Event format, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open. Its shape (docs/profiling.md has the full list):
//   process 1 "memfit rank R": counters "pool.<category>" and "pool.total" (the pool's
//     account, bytes; the maximum of pool.total is the run's measured peak), "live.activations",
//     "live.workspace" and "live.total" (the arenas' buffers that hold a live value), and with
//     the optimizer offloaded "disk.<category>" (the offload files' bytes); on thread 1 the
//     trainer's slices (step, micro-batch, data, optimizer, evaluation, collective, save, and
//     "io wait" (cat "io") inside an offloaded optimizer) with the step's phases nested in them
//     (cat "phase"); on thread 2 an instant event per
//     allocation and free (cat "alloc" / "free", args: tag, category, bytes, total_after);
//   process 2 "memfit rank R arena buffers": one thread per buffer, a slice per value it held.
#pragma once

#include <nlohmann/json.hpp>

#include "memfit/profile/step_recorder.h"
#include "memfit/profile/timeline.h"

namespace memfit::profile {

nlohmann::json trace_json(const StepRecorder& recorder, const std::vector<MemoryEvent>& events,
                          const Timeline& timeline, int rank);

}  // namespace memfit::profile
