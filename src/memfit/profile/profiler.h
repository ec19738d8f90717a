// `memfit train --profile DIR`: what the trainer holds while it profiles. It turns the pool's
// event log on from the run's start, records the trainer's slices and the running step
// (step_recorder.h) over the first `steps` steps, then writes trace.json, memory.html and
// summary.json into DIR (DIR/rank<r>/ under MPI), atomically, and keeps the printed summary.
// Note [Memory profile] (docs/notes/memory-profile.md) says how and what it costs.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/io/created_directories.h"
#include "memfit/memory/pool.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/profile/step_recorder.h"

namespace memfit::profile {

struct ProfileOptions {
  std::string dir;     // --profile
  int64_t steps = 3;   // --profile-steps: the first this many steps of the run
  int rank = 0, ranks = 1;
};

class Profiler {
 public:
  // Creates the output directory (IoError if it cannot) and starts the pool's event log. A run
  // that fails before the files are written leaves no empty directory it made
  // (io/created_directories.h).
  Profiler(const ProfileOptions& options, MemoryPool& pool,
           std::chrono::steady_clock::time_point origin);

  // The run's description for the summary and the page's title, and the planner's prediction
  // for this rank (none: drawn without one).
  void set_run(nlohmann::json run, std::optional<PlanReport> plan);
  // The offload files' bytes by category (OffloadedOptimizer::file_bytes), when offloading.
  void set_disk(const CategoryBytes& disk) { disk_ = disk; }
  // The recorder while the window is open or ahead, null after it.
  StepRecorder* recorder() { return finished_ ? nullptr : &recorder_; }

  // Step `step` (1-based) starts: the first call opens the window.
  void step_begin(int64_t step);
  // Step `step` has ended; true when that closed the window and the files were written.
  bool step_end(int64_t step);
  // Closes the window early (the run ended before it) and writes the files; nothing if written.
  void finish();
  bool finished() const { return finished_; }

  // Where this rank's files go: DIR, or DIR/rank<r> under MPI.
  const std::filesystem::path& dir() const { return dir_; }
  // The printed summary (empty until written).
  const std::string& text() const { return text_; }

 private:
  ProfileOptions options_;
  MemoryPool& pool_;
  std::filesystem::path dir_;
  io::CreatedDirectories made_;
  StepRecorder recorder_;
  nlohmann::json run_;
  std::optional<PlanReport> plan_;
  CategoryBytes disk_{};
  int64_t first_step_ = -1;
  int64_t begin_ = 0;
  bool finished_ = false;
  std::string text_;
};

}  // namespace memfit::profile
