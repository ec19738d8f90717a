#include "memfit/train/resume_state.h"

#include "memfit/core/error.h"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int64_t count_field(const json& s, const char* key, const fs::path& file) {
  if (!s.contains(key))
    MEMFIT_THROW(IoError, "resume", "{}: missing field '{}'", file.string(), key);
  const json& v = s[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
      v.get<int64_t>() < 0)
    MEMFIT_THROW(IoError, "resume", "{}: field '{}' must be a count (an integer >= 0), got {}",
                 file.string(), key, v.dump());
  return v.get<int64_t>();
}

// Checks that a resumed run is configured like the run that saved the checkpoint.
void check_resume(const json& s, const json& run, const fs::path& file) {
  auto same = [&](const char* key, const json& now) {
    if (!s.contains(key))
      MEMFIT_THROW(IoError, "resume", "{}: missing field '{}'", file.string(), key);
    if (s[key] != now)
      MEMFIT_THROW(ConfigError, "resume",
                   "{}: the checkpoint was trained with {} = {}, this run has {}; resume with "
                   "the same setting for a bit-identical continuation",
                   file.string(), key, s[key].dump(), now.dump());
  };
  for (const char* key : {"batch", "grad_accum", "seq_len", "seed", "shuffle", "optim"})
    same(key, run.at(key));
  // APOLLO's and GaLore's projections: the state's shape and the projections follow them.
  if (run.contains("optim_rank")) {
    same("optim_rank", run.at("optim_rank"));
    same("optim_proj_gap", run.at("optim_proj_gap"));
  }
  // More --steps train longer (Note [Training longer] in docs/notes/checkpoints.md); fewer
  // would end before where the schedule has already decayed to, so they are refused.
  const int64_t run_steps = run.at("steps").get<int64_t>();
  if (const int64_t steps = count_field(s, "steps", file); steps > run_steps)
    MEMFIT_THROW(ConfigError, "resume",
                 "{}: the checkpoint was trained with steps = {}, this run has {}; resume with "
                 "the same --steps for a bit-identical continuation, or more to train longer",
                 file.string(), steps, run_steps);
  same("attention", run.at("attention"));
  // Settings older checkpoints did not record, read there as what those runs did (`then_default`).
  auto same_or = [&](const char* key, const json& then_default, const json& now,
                     std::string_view advice) {
    const json then = s.value(key, then_default);
    if (then != now)
      MEMFIT_THROW(ConfigError, "resume",
                   "{}: the checkpoint was trained with {} = {}, this run has {}{}",
                   file.string(), key, then.dump(),
                   now.is_string() ? now.get<std::string>() : now.dump(), advice);
  };
  // Mixed precision: older checkpoints were fp32 with FP32 weights.
  same_or("precision", "fp32", run.at("precision"),
          "; resume in the same precision (or start a new run with --init-from, which converts)");
  // Activation compression (older checkpoints: none) changes the gradients (within its bound),
  // so a resume keeps it, as it keeps the attention kind.
  same_or("act_compress", "none", run.at("act_compress"),
          "; resume with the same --act-compress (or leave it out to keep the checkpoint's) for "
          "a bit-identical continuation");
  // --optim-state-dtype (older checkpoints: f32 moments).
  same_or("optim_state_dtype", "f32", run.at("optim_state_dtype"),
          "; resume with the same --optim-state-dtype (the saved moments are in that type)");
  // LoRA (Note [LoRA]): the same adapters, or none on both sides.
  same_or("lora", json(), run.value("lora", json()),
          "; resume with the same --lora-rank, --lora-alpha, --lora-targets and --base-dtype");
  same_or("master_weights", "fp32", run.at("master_weights"), "");
}

}  // namespace

ResumeState parse_trainer_state(std::string_view text, const json& run,
                                const fs::path& file) {
  ResumeState r;
  try {
    r.state = json::parse(text);
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "resume", "{}: not valid JSON: {}", file.string(), e.what());
  }
  if (!r.state.is_object())
    MEMFIT_THROW(IoError, "resume", "{}: expected a JSON object, got {}", file.string(),
                 r.state.type_name());
  check_resume(r.state, run, file);
  r.step = count_field(r.state, "step", file);
  r.steps = count_field(r.state, "steps", file);
  const int64_t steps = run.at("steps").get<int64_t>();
  if (r.step > steps)  // memfit saves at most at its last step: a file edited or damaged
    MEMFIT_THROW(IoError, "resume", "{}: step {} is past the run's steps ({})", file.string(),
                 r.step, steps);
  r.data_position = count_field(r.state, "data_position", file);
  if (r.state.contains("data_tokens")) r.data_tokens = count_field(r.state, "data_tokens", file);
  return r;
}

void check_resume_data(const ResumeState& saved, int64_t tokens, const std::string& data_dir,
                       const fs::path& file) {
  if (saved.data_tokens < 0 || saved.data_tokens == tokens) return;
  MEMFIT_THROW(ConfigError, "resume",
               "{}: the checkpoint was trained on {} tokens of training data, --data {} has {}: "
               "its data position would point elsewhere. Resume on the same data, or start a "
               "new run from these weights with --init-from",
               file.string(), saved.data_tokens, data_dir, tokens);
}

namespace {
// A float learning rate as written (6e-4f is 0.0006, not 0.000600000028...); strings quoted.
std::string shown(const json& v) {
  return v.is_number() ? fmt::format("{:g}", v.get<double>()) : v.dump();
}
}  // namespace

std::string schedule_changes(const ResumeState& saved, const json& run) {
  const json* was = saved.state.contains("schedule") && saved.state["schedule"].is_object()
                        ? &saved.state["schedule"]
                        : nullptr;
  if (!was) return "";
  const json& now = run.at("schedule");
  std::string out;
  for (const auto& [key, value] : now.items())
    // The schedule's length is --steps, which check_resume allows to grow (said apart).
    if (key != "total" && was->contains(key) && (*was)[key] != value)
      out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", key, shown((*was)[key]),
                         shown(value));
  return out;
}

std::string longer_run_note(const ResumeState& saved, const json& run) {
  const int64_t steps = run.at("steps").get<int64_t>();
  const json& schedule = run.at("schedule");
  if (steps <= saved.steps) return "";
  return fmt::format(
      "training on from step {} of a {}-step run to {} steps: the learning-rate schedule is "
      "stretched (its {} now spans {} steps, the warmup of {} kept), so from step {} the rate "
      "is the longer schedule's, above where the {}-step one ended; the result is not "
      "bit-identical to an uninterrupted {}-step run",
      saved.step, saved.steps, steps,
      schedule.at("kind") == "constant" ? "constant rate" : "cosine", steps,
      schedule.at("warmup").get<int64_t>(), saved.step + 1, saved.steps, steps);
}

}  // namespace memfit
