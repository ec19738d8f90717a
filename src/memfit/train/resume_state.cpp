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
void check_resume(const json& s, const TrainConfig& c, int T, const fs::path& file) {
  auto same = [&](const char* key, const json& now) {
    if (!s.contains(key))
      MEMFIT_THROW(IoError, "resume", "{}: missing field '{}'", file.string(), key);
    if (s[key] != now)
      MEMFIT_THROW(ConfigError, "resume",
                   "{}: the checkpoint was trained with {} = {}, this run has {}; resume with "
                   "the same setting for a bit-identical continuation",
                   file.string(), key, s[key].dump(), now.dump());
  };
  same("batch", c.batch);
  same("grad_accum", c.grad_accum);
  same("seq_len", T);
  same("seed", c.seed);
  same("shuffle", c.shuffle);
  same("optim", c.optim.name);
  // More --steps train longer (Note [Training longer] in docs/notes/checkpoints.md); fewer
  // would end before where the schedule has already decayed to, so they are refused.
  if (const int64_t steps = count_field(s, "steps", file); steps > c.steps)
    MEMFIT_THROW(ConfigError, "resume",
                 "{}: the checkpoint was trained with steps = {}, this run has {}; resume with "
                 "the same --steps for a bit-identical continuation, or more to train longer",
                 file.string(), steps, c.steps);
  same("attention", c.attention);
  // Older checkpoints predate mixed precision and were fp32 with FP32 weights.
  const json precision = s.value("precision", json("fp32"));
  if (precision != c.precision)
    MEMFIT_THROW(ConfigError, "resume",
                 "{}: the checkpoint was trained with precision = {}, this run has {}; resume "
                 "in the same precision (or start a new run with --init-from, which converts)",
                 file.string(), precision.dump(), c.precision);
  // Older checkpoints predate activation compression and stored none. Compression changes the
  // gradients (within its bound), so a resume keeps it, as it keeps the attention kind.
  const json compress = s.value("act_compress", json("none"));
  const std::string now = c.act_compress.empty() ? "none" : c.act_compress;
  if (compress != now)
    MEMFIT_THROW(ConfigError, "resume",
                 "{}: the checkpoint was trained with act_compress = {}, this run has {}; resume "
                 "with the same --act-compress (or leave it out to keep the checkpoint's) for a "
                 "bit-identical continuation",
                 file.string(), compress.dump(), now);
  // LoRA (Note [LoRA]): the same adapters, or none on both sides.
  const json lora_then = s.value("lora", json());
  const json lora_now =
      c.lora.enabled()
          ? json{{"rank", c.lora.rank}, {"alpha", c.lora.alpha}, {"targets", c.lora.targets}}
          : json();
  if (lora_then != lora_now)
    MEMFIT_THROW(ConfigError, "resume",
                 "{}: the checkpoint was trained with lora = {}, this run has {}; resume with "
                 "the same --lora-rank, --lora-alpha and --lora-targets",
                 file.string(), lora_then.dump(), lora_now.dump());
  const json master = s.value("master_weights", json("fp32"));
  if (master != c.master_weights)
    MEMFIT_THROW(ConfigError, "resume",
                 "{}: the checkpoint was trained with master_weights = {}, this run has {}",
                 file.string(), master.dump(), c.master_weights);
}

}  // namespace

ResumeState parse_trainer_state(std::string_view text, const TrainConfig& config, int T,
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
  check_resume(r.state, config, T, file);
  r.step = count_field(r.state, "step", file);
  r.steps = count_field(r.state, "steps", file);
  if (r.step > config.steps)  // memfit saves at most at its last step: a file edited or damaged
    MEMFIT_THROW(IoError, "resume", "{}: step {} is past the run's steps ({})", file.string(),
                 r.step, config.steps);
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

std::string schedule_changes(const ResumeState& saved, const TrainConfig& c) {
  const json* was = saved.state.contains("schedule") && saved.state["schedule"].is_object()
                        ? &saved.state["schedule"]
                        : nullptr;
  if (!was) return "";
  const json now = c.schedule.to_json();
  std::string out;
  for (const auto& [key, value] : now.items())
    // The schedule's length is --steps, which check_resume allows to grow (said apart).
    if (key != "total" && was->contains(key) && (*was)[key] != value)
      out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", key, shown((*was)[key]),
                         shown(value));
  return out;
}

std::string longer_run_note(const ResumeState& saved, const TrainConfig& c) {
  if (c.steps <= saved.steps) return "";
  return fmt::format(
      "training on from step {} of a {}-step run to {} steps: the learning-rate schedule is "
      "stretched (its {} now spans {} steps, the warmup of {} kept), so from step {} the rate "
      "is the longer schedule's, above where the {}-step one ended; the result is not "
      "bit-identical to an uninterrupted {}-step run",
      saved.step, saved.steps, c.steps, c.schedule.kind == "constant" ? "constant rate" : "cosine",
      c.steps, c.schedule.warmup, saved.step + 1, saved.steps, c.steps);
}

}  // namespace memfit
