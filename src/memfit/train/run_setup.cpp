#include "memfit/train/run_setup.h"

#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/core/scoped_threads.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/memory/pool.h"
#include "memfit/plan/fit_advice.h"

namespace memfit {

namespace fs = std::filesystem;

void validate_train_config(const TrainConfig& c) {
  auto require = [](bool ok, const char* field, auto value, const char* expectation) {
    if (!ok)
      MEMFIT_THROW(ConfigError, "config", "--{} must be {}, got {}", field, expectation, value);
  };
  // --ckpt auto and --auto-batch ask the planner to fit the budget (train/run_setup.h), so
  // they need one; the planner replaces them before anything is built.
  if (c.ckpt == "auto" && c.mem_limit.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--ckpt auto picks the fastest checkpoint policy whose predicted peak fits "
                 "--mem-limit, so it needs --mem-limit (e.g. --mem-limit 4GiB); or name a "
                 "policy: none, full, selective, every:K, layers:LIST");
  if (c.zero_auto && c.mem_limit.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--zero auto picks the ZeRO stage whose every rank's predicted peak fits "
                 "--mem-limit (each rank's budget), so it needs --mem-limit (e.g. --mem-limit "
                 "4GiB); or name a stage: 0, 1, 2 or 3");
  if (c.auto_batch && c.mem_limit.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--auto-batch picks the micro-batch (and --grad-accum) that fits --mem-limit, "
                 "so it needs --mem-limit (e.g. --mem-limit 4GiB)");
  require(c.batch > 0, "batch", c.batch, "positive");
  require(c.grad_accum > 0, "grad-accum", c.grad_accum, "positive");
  require(c.steps >= 0, "steps", c.steps, ">= 0");
  require(c.eval_batches > 0, "eval-batches", c.eval_batches, "positive");
  require(c.eval_every >= 0, "eval-every", c.eval_every, ">= 0");
  require(c.save_every >= 0, "save-every", c.save_every, ">= 0");
  require(c.save_every_minutes >= 0, "save-every-minutes", c.save_every_minutes, ">= 0");
  require(c.clip >= 0, "clip", c.clip, ">= 0");
  require(c.threads >= 0 && c.threads <= kMaxThreads, "threads", c.threads,
          fmt::format("between 0 (all cores) and {}", kMaxThreads).c_str());
  // Far beyond any cluster: `memfit plan` lists every rank (a second each per ten thousand).
  require(c.ranks >= 1 && c.ranks <= (1 << 20), "ranks", c.ranks, "between 1 and 1048576");
  require(c.bucket_mb > 0, "bucket-mb", c.bucket_mb, "positive");
  require(c.collective_timeout >= 0, "collective-timeout", c.collective_timeout, ">= 0");
  require(c.stop_after >= 0, "stop-after", c.stop_after, ">= 0");
  require(c.profile_steps >= 1, "profile-steps", c.profile_steps, ">= 1");
  require(c.test_leak_bytes >= 0, "test-leak-bytes", c.test_leak_bytes, ">= 0");
  require(c.resume_dir.empty() || c.init_from.empty(), "init-from", c.init_from,
          "unset when --resume is given (resume restores the weights)");
  require(c.zero >= 0 && c.zero <= 3, "zero", c.zero, "0, 1, 2 or 3");
  require(c.prefetch_depth >= 0, "prefetch-depth", c.prefetch_depth, ">= 0");
  require(c.persist_threshold >= 0, "persist-threshold", c.persist_threshold, ">= 0 elements");
  c.schedule.validate();
  if (c.master_weights != "fp32" && c.master_weights != "none")
    MEMFIT_THROW(ConfigError, "config", "--master-weights must be fp32 or none, got '{}'",
                 c.master_weights);
  if (!c.offload_optimizer.empty() && c.offload_optimizer != "none" &&
      c.offload_optimizer != "nvme")
    MEMFIT_THROW(ConfigError, "config", "--offload-optimizer must be none or nvme, got '{}'",
                 c.offload_optimizer);
  if (c.offload_params != "none" && c.offload_params != "nvme")
    MEMFIT_THROW(ConfigError, "config", "--offload-params must be none or nvme, got '{}'",
                 c.offload_params);
  if (!c.offload_grads.empty() && c.offload_grads != "none" && c.offload_grads != "nvme")
    MEMFIT_THROW(ConfigError, "config", "--offload-grads must be none or nvme, got '{}'",
                 c.offload_grads);
  // The rules between the options (precision, attention, policy, optimizer) are the RunSpec's
  // (RunSpec::check), checked by resolve_run once these are parsed.
  if (c.precision_options().precision == Precision::fp16) c.loss_scaler.validate();
}

namespace {

// A checkpoint fixes the model: --model and the shape options, where given with --resume or
// --init-from, must name the checkpoint's (--seq-len is the rows' length there, checked against
// its context by resolve_run_model), or the run would silently train another model than asked.
void check_checkpoint_model(const TrainConfig& cfg, const ModelConfig& saved,
                            const fs::path& dir) {
  const char* option = !cfg.resume_dir.empty() ? "--resume" : "--init-from";
  auto differs = [&](const char* what, const std::string& asked, const std::string& has) {
    MEMFIT_THROW(ConfigError, "config",
                 "{} {} is not the checkpoint's: {} {} has {} ({}); a checkpoint fixes the "
                 "model, so leave {} out, or start a new run",
                 what, asked, option, dir.string(), has, saved.describe(), what);
  };
  if (!cfg.model.empty()) {
    // The fields a checkpoint's own config.json may set apart from the preset's shape: its
    // context (--seq-len is the rows' length with a checkpoint), norm epsilon, rope scaling.
    ModelConfig want = cfg.model_config();
    want.max_seq_len = saved.max_seq_len;
    want.rope_scaling = saved.rope_scaling;
    want.norm_eps = saved.norm_eps;
    if (const auto diffs = io::config_differences(saved, want); !diffs.empty())
      MEMFIT_THROW(ConfigError, "config",
                   "--model {} is not the model of the checkpoint {} {} ({}): {}; a checkpoint "
                   "fixes the model: leave --model and the shape options out, or start a new run",
                   cfg.model, option, dir.string(), saved.describe(), fmt::join(diffs, "; "));
    return;
  }
  auto same = [&](int asked, int has, const char* what) {
    if (asked != 0 && asked != has) differs(what, std::to_string(asked), std::to_string(has));
  };
  same(cfg.n_layer, saved.n_layer, "--n-layer");
  same(cfg.n_head, saved.n_head, "--n-head");
  same(cfg.d_model, saved.d_model, "--d-model");
  same(cfg.vocab, saved.vocab_size, "--vocab");
  same(cfg.n_kv_head, saved.n_kv_head, "--n-kv-head");
  same(cfg.ffn_dim, saved.ffn_dim, "--ffn-dim");
  if (cfg.rope_theta != 0 && cfg.rope_theta != saved.rope_theta)
    differs("--rope-theta", fmt::format("{}", cfg.rope_theta),
            fmt::format("{}", saved.rope_theta));
  const char* tied = saved.tie_embeddings ? "true" : "false";
  if (!cfg.tie_embeddings.empty() && cfg.tie_embeddings != tied)
    differs("--tie-embeddings", cfg.tie_embeddings, tied);
}

}  // namespace

RunModel resolve_run_model(const TrainConfig& cfg) {
  RunModel r;
  const fs::path source = !cfg.resume_dir.empty() ? cfg.resume_dir : cfg.init_from;
  if (!source.empty()) {
    r.location = io::locate_checkpoint(source);
    r.config = io::read_model_config(r.location.dir / "config.json");
    check_checkpoint_model(cfg, r.config, r.location.dir);
  } else {
    r.config = cfg.model_config();
  }
  r.T = cfg.seq_len ? cfg.seq_len : r.config.max_seq_len;
  if (r.T > r.config.max_seq_len)
    MEMFIT_THROW(ConfigError, "config", "--seq-len {} exceeds the model's context of {}", r.T,
                 r.config.max_seq_len);
  return r;
}

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

// --act-compress: as given; else, resuming, the checkpoint's (none before the field existed, or
// where it cannot be read: the trainer's resume check then names what is wrong); else none.
ActCompress run_act_compress(const TrainConfig& c) {
  if (!c.act_compress.empty()) return act_compress_from_name(c.act_compress);
  if (c.resume_dir.empty()) return ActCompress::none;
  const nlohmann::json s = resumed_state(c);
  const auto it = s.find("act_compress");
  if (it == s.end() || !it->is_string()) return ActCompress::none;
  const std::string name = it->get<std::string>();
  return name == "int8" ? ActCompress::int8 : name == "fp8" ? ActCompress::fp8 : ActCompress::none;
}

}  // namespace

RunSpec resolve_run(const TrainConfig& c, io::CheckpointLocation* location) {
  validate_train_config(c);
  const RunModel run = resolve_run_model(c);
  if (location) *location = run.location;
  RunSpec s;
  s.model = run.config;
  s.T = run.T;
  s.batch = c.batch;
  s.grad_accum = c.grad_accum;
  s.steps = c.steps;
  s.precision = c.precision_options();
  s.lora = c.lora;
  s.attention = attention_kind_from_name(c.attention);
  s.lm_head_group = c.lm_head_group;
  s.ckpt_auto = c.ckpt == "auto";
  if (!s.ckpt_auto) s.ckpt = CheckpointPolicy::parse(c.ckpt);
  s.act_compress = run_act_compress(c);
  s.act_compress_open = c.act_compress.empty() && c.resume_dir.empty();
  s.auto_batch = c.auto_batch;
  s.optim = c.optim;
  s.optim.n_head = run.config.n_head;
  s.optim.seed = c.seed;
  s.threads = c.threads;
  s.world = c.ranks;
  s.zero = c.zero_auto ? 0 : c.zero;
  s.zero_auto = c.zero_auto;
  s.prefetch_depth = c.prefetch_depth;
  s.persist_threshold = c.persist_threshold;
  s.sync_every_micro_batch = c.sync_every_micro_batch;
  if (c.grad_dtype != "fp32" && c.grad_dtype != "bf16")
    MEMFIT_THROW(ConfigError, "config", "--grad-dtype must be fp32 or bf16, got '{}'",
                 c.grad_dtype);
  s.grad_dtype = c.grad_dtype == "bf16" ? DType::bf16 : DType::f32;
  s.bucket_bytes = static_cast<size_t>(c.bucket_mb * 1048576.0);
  s.mem_limit = c.mem_limit.empty() ? 0 : parse_bytes(c.mem_limit, "--mem-limit");
  s.data_dir = c.data_dir;
  s.saves = !c.save_dir.empty();
  s.shuffle = c.shuffle;
  s.resumed = !c.resume_dir.empty();
  s.offload.optimizer = c.offload_optimizer == "nvme";
  s.offload_open = c.offload_optimizer.empty() && !c.offload_dir.empty();
  s.offload.params = c.offload_params == "nvme";
  s.offload.grads = c.offload_grads == "nvme";
  s.offload_grads_open = c.offload_grads.empty() && !c.offload_dir.empty();
  s.offload.dir = c.offload_dir;
  s.offload.disk_limit = c.disk_limit.empty() ? 0 : parse_bytes(c.disk_limit, "--disk-limit");
  s.check();
  return s;
}

namespace {

// A resumed run must keep the micro-batch it was saved with (the trainer refuses another), so
// --auto-batch keeps the checkpoint's. Without a readable trainer_state.json the search goes
// ahead and the trainer's own resume checks report what is wrong.
bool pin_resumed_batch(const TrainConfig& config, RunSpec& spec, std::string* note) {
  const nlohmann::json s = resumed_state(config);
  if (!s.contains("batch") || !s.contains("grad_accum")) return false;
  const int batch = s["batch"].get<int>(), accum = s["grad_accum"].get<int>();
  if (batch * accum != spec.batch * spec.grad_accum)
    MEMFIT_THROW(ConfigError, "config",
                 "--auto-batch keeps the global batch, but the checkpoint in {} was trained "
                 "with {} x {} = {} rows a step and this run asks for --batch {} x --grad-accum "
                 "{} = {}",
                 config.resume_dir, batch, accum, batch * accum, spec.batch, spec.grad_accum,
                 spec.batch * spec.grad_accum);
  spec.batch = batch;
  spec.grad_accum = accum;
  if (note)
    *note = fmt::format("resuming: the micro-batch stays the checkpoint's, --batch {} "
                        "--grad-accum {}",
                        batch, accum);
  return true;
}

// The search for a resolved run (spec = resolve_run(config)).
SearchResult search_run(const TrainConfig& config, const RunSpec& spec, std::string* note) {
  if (spec.mem_limit == 0)
    MEMFIT_THROW(ConfigError, "config",
                 "the planner's search needs a budget: give --mem-limit (e.g. 4GiB)");
  RunSpec base = spec;
  SearchSpace space = SearchSpace::of(spec);
  if (space.micro_batches && spec.resumed && pin_resumed_batch(config, base, note))
    space.micro_batches = false;
  if (spec.zero_auto && spec.world == 1 && note)
    *note += std::string(note->empty() ? "" : "; ") +
             "--zero auto with one rank: stage 0 (one process has nothing to shard; under "
             "mpirun -n N, or memfit plan --world-size N, the search chooses the stage)";
  return search_training(base, spec.mem_limit, space);
}

// The TrainConfig side of the choice: what trainer_state.json and the logs name.
TrainConfig with_choice(const TrainConfig& base, const Candidate& c) {
  TrainConfig t = base;
  t.ckpt = c.ckpt;
  t.act_compress = act_compress_name(c.act_compress);
  t.offload_optimizer = c.offload ? "nvme" : "none";
  t.offload_params = c.offload_params ? "nvme" : "none";
  t.offload_grads = c.offload_grads ? "nvme" : "none";
  t.batch = c.batch;
  t.grad_accum = c.grad_accum;
  t.auto_batch = false;
  t.zero = c.zero;
  t.zero_auto = false;
  return t;
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

SearchResult plan_auto(const TrainConfig& config, const RunSpec& spec, std::string* note) {
  return search_run(config, spec, note);
}

AutoResolution resolve_auto(const TrainConfig& config) {
  AutoResolution r;
  r.config = config;
  r.precision_note = resolve_precision(r.config);
  r.spec = resolve_run(r.config, &r.location);
  // What trainer_state.json records: as given, the checkpoint's, or none (the search may still
  // change it below).
  r.config.act_compress = act_compress_name(r.spec.act_compress);
  if (!r.config.needs_planner()) return r;
  r.planned = true;
  r.search = search_run(r.config, r.spec, &r.note);
  if (!r.search.fits) {
    const Candidate& s = r.search.smallest;
    OutOfMemoryError e(detail::where(__FILE__, __LINE__), r.search.message, s.peak_bytes,
                       s.dominant(), r.search.limit, CategoryBytes{});
    e.set_advice(advise_fit(r.spec, r.search.limit).text());
    throw e;
  }
  r.config = with_choice(r.config, r.search.choice);
  r.spec = apply_candidate(r.spec, r.search.choice);
  return r;
}

void adopt_lead_choice(AutoResolution& r, dist::Communicator& comm) {
  if (comm.size() == 1 || !r.planned) return;
  const TrainConfig& c = r.config;
  std::string choice = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}", c.ckpt, c.act_compress,
                                   c.offload_optimizer, c.offload_params, c.batch, c.grad_accum,
                                   c.zero);
  int64_t size = static_cast<int64_t>(choice.size());
  comm.broadcast(&size, sizeof size, 0);
  std::string lead(static_cast<size_t>(size), '\0');
  if (comm.rank() == 0) lead = choice;
  comm.broadcast(lead.data(), size, 0);
  if (lead == choice) return;
  std::istringstream in(lead);
  TrainConfig t = r.config;
  std::string batch, accum, zero;
  std::getline(in, t.ckpt);
  std::getline(in, t.act_compress);
  std::getline(in, t.offload_optimizer);
  std::getline(in, t.offload_params);
  std::getline(in, batch);
  std::getline(in, accum);
  std::getline(in, zero);
  t.batch = std::stoi(batch);
  t.grad_accum = std::stoi(accum);
  t.zero = std::stoi(zero);
  r.config = t;
  r.spec = resolve_run(t);
  r.search.choice.ckpt = t.ckpt;
  r.search.choice.act_compress = r.spec.act_compress;
  r.search.choice.batch = t.batch;
  r.search.choice.grad_accum = t.grad_accum;
  r.search.choice.zero = t.zero;
  r.search.choice.offload = r.spec.offload.optimizer;
  r.search.choice.offload_params = r.spec.offload.params;
  r.search.choice.offload_grads = r.spec.offload.grads;
}

void check_max_model_config(const TrainConfig& c) {
  auto refuse = [](bool fixed, const char* option, const char* why) {
    if (fixed)
      MEMFIT_THROW(ConfigError, "config", "--max-model varies {}; leave {} unset", why, option);
  };
  if (c.mem_limit.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--max-model finds the largest model that fits --mem-limit, so it needs "
                 "--mem-limit (e.g. --mem-limit 8GiB)");
  refuse(c.n_layer != 0, "--n-layer", "the depth");
  refuse(c.d_model != 0, "--d-model", "the width");
  refuse(c.n_head != 0, "--n-head", "the heads (64 dimensions each)");
  refuse(c.n_kv_head != 0, "--n-kv-head", "the key/value heads (the preset's grouping)");
  refuse(c.ffn_dim != 0, "--ffn-dim", "the MLP width (the preset's ratio)");
  refuse(!c.resume_dir.empty(), "--resume", "the model (a checkpoint fixes it)");
  refuse(!c.init_from.empty(), "--init-from", "the model (a checkpoint fixes it)");
  // A fixed policy is planned for every member (none, full, selective, every:K), but a list of
  // blocks cannot hold at every depth.
  refuse(c.ckpt.rfind("layers:", 0) == 0, "--ckpt",
         "the depth, so a layers: list of blocks cannot hold for every member (give none, full, "
         "selective or every:K, or auto for each member's fastest)");
}

}  // namespace memfit
