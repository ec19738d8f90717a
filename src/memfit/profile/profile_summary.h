// summary.json and the printed summary of a profile: the peak by category (measured by the pool
// and planned by plan_memory), the moment the most bytes hold live values with the buffers live
// then (the top 20 printed, all in the JSON), the bytes live in each phase of the step, and the
// share of activations against parameters; with the optimizer offloaded, the disk tier (the
// files' bytes against the plan's, by category). profile-diff (profile_diff.h) compares two of them.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/kernels/kernel_times.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/profile/step_recorder.h"
#include "memfit/profile/timeline.h"

namespace memfit::profile {

inline constexpr int kSummaryVersion = 1;
inline constexpr size_t kTopBuffers = 20;
inline constexpr size_t kTopGroups = 10;
inline constexpr size_t kTopKernels = 15;  // kernels in the printed summary

// What the summary reports besides the record and the timeline.
struct SummaryInputs {
  nlohmann::json run;              // the run's description (model, shapes, precision, policy...)
  const PlanReport* plan = nullptr;  // the planner's prediction for this rank; null: none
  CategoryBytes peak_by_category{};  // the pool's breakdown at its peak (MemoryPool::peak_breakdown)
  uint64_t events = 0, events_dropped = 0;  // the pool's event log
  size_t rss_bytes = 0, pool_bytes = 0;     // at the end of the window
  std::vector<kernels::KernelTime> kernels;  // the window's time in kernels (Note [Kernel times])
};

nlohmann::json summary_json(const StepRecorder& recorder, const Timeline& timeline,
                            const SummaryInputs& inputs);

// summary.json's `kernels`: name, calls, ms and (for GEMMs) gflops_per_s of each, calls and ms
// divided by `per` (1: totals; the number of steps: per step).
nlohmann::json kernels_json(const std::vector<kernels::KernelTime>& times, double per = 1);

// The printed summary, from summary.json alone (`files`: where the three files are).
std::string summary_text(const nlohmann::json& summary, const std::string& files);

// "h.*.fch" for "h.11.fch", "rc.*.qkv" for "rc.0.qkv": block numbers out, so a block's buffers
// group across blocks (the summary's top_groups, profile-diff).
std::string tag_group(const std::string& tag);

// "12.5" (MiB, one decimal), for the tables here and in profile-diff.
std::string mib(double bytes);

}  // namespace memfit::profile
