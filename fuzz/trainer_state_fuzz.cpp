// libFuzzer harness for a checkpoint's trainer_state.json as a resumed run reads it
// (train/resume_state.h), against the settings that the seed corpus's states were saved with, so
// inputs near a valid state get past the agreement checks to the counts and the fp16 loss
// scaler's state (train/loss_scaler.h).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/train/loss_scaler.h"
#include "memfit/train/resume_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  TrainConfig config;  // batch 8, grad_accum 1, seed 1337, 100 steps, shuffled, adamw, flash
  config.batch = 4;
  config.steps = 30;
  try {
    const ResumeState s =
        parse_trainer_state(fuzz::as_text(data, size), config, 64, "trainer_state.json");
    if (s.step < 0 || s.data_position < 0) __builtin_trap();
    if (s.state.contains("loss_scaler")) {
      DynamicLossScaler scaler(config.loss_scaler);
      scaler.load_json(s.state["loss_scaler"]);
    }
  } catch (const Error&) {
  }
  return 0;
}
