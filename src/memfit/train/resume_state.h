// Reading a checkpoint's trainer_state.json when a run resumes: where the run stands (step and
// data position) and the check that it is configured as the run that saved it. Kept apart from
// the trainer so the reader of these outside bytes can be fuzzed on its own (fuzz/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>


namespace memfit {

struct ResumeState {
  int64_t step = 0;           // optimizer steps taken when it was saved
  int64_t steps = 0;          // the --steps of the run that saved it (this run's may be more)
  int64_t data_position = 0;  // the training loader's position
  int64_t data_tokens = -1;   // the training data's tokens (-1: not recorded, an older file)
  nlohmann::json state;       // the whole object (the loss scaler's state, when there is one)
};

// Parses `text`, the contents of `file`, and checks it against `run`: the settings this run
// records in its own trainer_state.json (TrainRun::run_state_json: batch, grad_accum, seq_len,
// seed, shuffle, optim, steps, attention, precision, act_compress, master_weights, schedule), so
// what a resume compares is what a save writes. Throws IoError naming the file when it is not a JSON object or a field is missing
// or of the wrong type, and ConfigError naming the setting that differs from the saved run's
// (--steps may be more: a longer run, Note [Training longer] in docs/notes/checkpoints.md).
ResumeState parse_trainer_state(std::string_view text, const nlohmann::json& run,
                                const std::filesystem::path& file);

// ConfigError unless the training data has the `tokens` the checkpoint's data had: the data
// position counts into that data, and on other data it would point elsewhere.
void check_resume_data(const ResumeState& saved, int64_t tokens, const std::string& data_dir,
                       const std::filesystem::path& file);

// The learning-rate schedule's settings that differ from the saved run's, as one line ("lr 0.0003
// -> 0.0001, warmup 100 -> 0"), empty when none do; not its length (--steps, which
// longer_run_note says). Not an error: resuming with a new rate is a
// choice a user makes on purpose (after a loss spike, say); the run says so, since the
// continuation is then not bit-identical.
std::string schedule_changes(const ResumeState& saved, const nlohmann::json& run);

// Where this run has more --steps than the checkpoint's: what happens to the schedule (its
// cosine stretched over the new length, the warmup kept) and that the run is then not
// bit-identical to an uninterrupted one, as one sentence; empty for the same --steps.
std::string longer_run_note(const ResumeState& saved, const nlohmann::json& run);

}  // namespace memfit
