#include "memfit/plan/auto_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/memory/pool.h"
#include "memfit/plan/fit_advice.h"
#include "memfit/train/trainer.h"

namespace memfit {

namespace {

// The resumed checkpoint's trainer_state.json, or an empty object where it cannot be read (the
// trainer's own resume checks then report what is wrong).
nlohmann::json resumed_state(const TrainConfig& config) {
  const RunModel run = resolve_run_model(config);
  try {
    return nlohmann::json::parse(
        io::read_file_to_string(run.location.dir / "trainer_state.json"));
  } catch (const std::exception&) {
    return nlohmann::json::object();
  }
}

// A resumed run must keep the micro-batch it was saved with (the trainer refuses another), so
// --auto-batch keeps the checkpoint's. Without a readable trainer_state.json the search goes
// ahead and the trainer's own resume checks report what is wrong.
bool pin_resumed_batch(TrainConfig& config, std::string* note) {
  const nlohmann::json s = resumed_state(config);
  if (!s.contains("batch") || !s.contains("grad_accum")) return false;
  const int batch = s["batch"].get<int>(), accum = s["grad_accum"].get<int>();
  if (batch * accum != config.batch * config.grad_accum)
    MEMFIT_THROW(ConfigError, "config",
                 "--auto-batch keeps the global batch, but the checkpoint in {} was trained "
                 "with {} x {} = {} rows a step and this run asks for --batch {} x --grad-accum "
                 "{} = {}",
                 config.resume_dir, batch, accum, batch * accum, config.batch,
                 config.grad_accum, config.batch * config.grad_accum);
  config.batch = batch;
  config.grad_accum = accum;
  if (note)
    *note = fmt::format("resuming: the micro-batch stays the checkpoint's, --batch {} "
                        "--grad-accum {}",
                        batch, accum);
  return true;
}

}  // namespace

std::string resolve_precision(TrainConfig& config) {
  if (config.precision != "auto") return "";
  if (!config.resume_dir.empty()) {
    const nlohmann::json s = resumed_state(config);
    if (s.contains("precision") && s["precision"].is_string()) {
      config.precision = s["precision"].get<std::string>();
      return fmt::format("--precision auto: {}, the checkpoint's (a resume keeps its precision)",
                         config.precision);
    }
  }
  std::string why;
  config.precision = std::string(precision_name(auto_precision(&why)));
  return "--precision auto: " + why;
}

SearchResult plan_auto(const TrainConfig& config, std::string* note) {
  validate_train_config(config);  // --ckpt auto and --auto-batch without --mem-limit
  if (config.mem_limit.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "the planner's search needs a budget: give --mem-limit (e.g. 4GiB)");
  const size_t limit = parse_bytes(config.mem_limit, "--mem-limit");
  TrainConfig base = config;
  SearchSpace space = SearchSpace::of(config);
  if (space.micro_batches && !config.resume_dir.empty() && pin_resumed_batch(base, note))
    space.micro_batches = false;
  return search_training(base, limit, space);
}

AutoResolution resolve_auto(const TrainConfig& config) {
  AutoResolution r;
  r.config = config;
  r.precision_note = resolve_precision(r.config);
  if (!r.config.needs_planner()) return r;
  r.planned = true;
  r.search = plan_auto(r.config, &r.note);
  if (!r.search.fits) {
    const Candidate& s = r.search.smallest;
    OutOfMemoryError e(detail::where(__FILE__, __LINE__), r.search.message, s.peak_bytes,
                       s.dominant(), r.search.limit, CategoryBytes{});
    e.set_advice(advise_fit(config, r.search.limit).text());
    throw e;
  }
  r.config = apply_candidate(r.config, r.search.choice);
  return r;
}

}  // namespace memfit
