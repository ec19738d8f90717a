// The LoRA trainer tests' resume check, shared by lora_trainer_test.cpp (f32) and
// lora_bf16_trainer_test.cpp (bf16 base, Note [LoRA], "bf16"): a run in one go against the same
// run stopped, saved and resumed, compared byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "memfit/cli/options/train_config.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "../io/io_test_util.h"

namespace memfit::test {

// Trains `c` (its c.steps steps) in one go into <dir>/whole, and again stopped after
// `stop_after` steps into <dir>/split; calls `between` with that save (for the checks a test
// makes on it, such as refused resumes); resumes it to the end in place. The adapters, their
// optimizer state and the base weights are then byte for byte those of the run in one go.
inline void expect_lora_resume_matches_one_run(
    const std::filesystem::path& dir, const TrainConfig& c, int stop_after = 2,
    const std::function<void(const std::filesystem::path& split)>& between = {}) {
  TrainConfig whole = c;
  whole.save_dir = (dir / "whole").string();
  train(whole);
  TrainConfig first = c;
  first.stop_after = stop_after;
  first.save_dir = (dir / "split").string();
  train(first);
  if (between) between(first.save_dir);
  TrainConfig second = c;
  second.resume_dir = second.save_dir = first.save_dir;
  train(second);
  for (const char* f : {io::kAdapterModelFile, io::kAdapterOptimizerFile, "model.safetensors"})
    EXPECT_EQ(io::testing::first_difference(dir / "whole" / f, dir / "split" / f), "") << f;
}

}  // namespace memfit::test
