// libFuzzer harness for a checkpoint's trainer_state.json as a resumed run reads it
// (train/resume_state.h), against the settings that the seed corpus's states were saved with, so
// inputs near a valid state get past the agreement checks to the counts and the fp16 loss
// scaler's state (train/loss_scaler.h).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/train/loss_scaler.h"
#include "memfit/train/lr_schedule.h"
#include "memfit/train/resume_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  // The settings the corpus's states were saved with, as a run records them
  // (TrainRun::run_state_json).
  const nlohmann::json run = {
      {"seed", 1337},          {"batch", 4},           {"grad_accum", 1},
      {"seq_len", 64},         {"steps", 30},          {"shuffle", true},
      {"optim", "adamw"},      {"attention", "flash"}, {"precision", "fp32"},
      {"act_compress", "none"}, {"master_weights", "fp32"}, {"optim_state_dtype", "f32"},
      {"schedule", LrSchedule{.total = 30}.to_json()}};
  try {
    const ResumeState s =
        parse_trainer_state(fuzz::as_text(data, size), run, "trainer_state.json");
    if (s.step < 0 || s.data_position < 0) __builtin_trap();
    if (s.state.contains("loss_scaler")) {
      DynamicLossScaler scaler(LossScalerConfig{});
      scaler.load_json(s.state["loss_scaler"]);
    }
  } catch (const Error&) {
  }
  return 0;
}
