#include "memfit/cli/options/resolve_train_spec.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/core/scoped_threads.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/sharded_safetensors.h"
#include "memfit/memory/pool.h"
#include "memfit/model/pipeline_interleaved.h"
#include "memfit/plan/fit_advice.h"
#include "memfit/plan/layout_search.h"
#include "memfit/plan/pipeline_time.h"

namespace memfit {

bool parse_tp_overlap(const std::string& value) {
  if (value != "on" && value != "off")
    MEMFIT_THROW(ConfigError, "config", "--tp-overlap must be on or off, got '{}'", value);
  return value == "on";
}

namespace fs = std::filesystem;

void validate_train_config(const TrainConfig& c) {
  auto require = [](bool ok, const char* field, auto value, const char* expectation) {
    if (!ok)
      MEMFIT_THROW(ConfigError, "config", "--{} must be {}, got {}", field, expectation, value);
  };
  // --ckpt auto and --auto-batch ask the planner to fit the budget (resolve_auto), so they need
  // one; the planner replaces them before anything is built.
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
  require(c.clip_mode == "global" || c.clip_mode == "unit", "clip-mode", c.clip_mode,
          "global or unit");
  if (c.clip_mode == "unit" && !c.update_in_backward)
    MEMFIT_THROW(ConfigError, "config",
                 "--clip-mode unit clips each unit by its own norm as the update in the backward "
                 "steps it, so it needs --update-in-backward (without it --clip bounds the global "
                 "norm: --clip-mode global)");
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

StartingCheckpoint::StartingCheckpoint(const TrainConfig& config) : config_(config) {}

const RunModel& StartingCheckpoint::model() {
  if (!model_) model_ = resolve_run_model(config_);
  return *model_;
}

const nlohmann::json& StartingCheckpoint::state() {
  if (state_) return *state_;
  state_ = nlohmann::json::object();
  if (config_.resume_dir.empty()) return *state_;
  const fs::path file = model().location.dir / "trainer_state.json";
  try {
    state_text_ = io::read_file_to_string(file);
    *state_ = nlohmann::json::parse(*state_text_);
  } catch (const std::exception&) {
  }
  return *state_;
}

RunCheckpoint StartingCheckpoint::checkpoint() {
  RunCheckpoint c;
  c.location = model().location;
  if (!c.location.dir.empty()) c.config = model().config;  // its config.json, as read
  c.resume = !config_.resume_dir.empty();
  c.lora_from = config_.lora_from;
  if (!c.location.dir.empty()) c.option = c.resume ? "--resume" : "--init-from";
  if (c.resume) {
    state();
    c.state_text = state_text_;
  }
  return c;
}

namespace {

// --pp-schedule (with --pp above 1): gpipe or 1f1b, or interleaved over --pp-virtual chunks a
// rank (Note [Pipeline parallel], "Interleaved"; RunSpec::pipe_virtual), which needs P x V
// blocks at least.
void set_pipeline_schedule(RunSpec& s, const TrainConfig& c) {
  if (c.pp_schedule != "interleaved") {
    s.pipe_schedule = parse_pipe_schedule(c.pp_schedule);
    if (c.pp_virtual != 1)
      MEMFIT_THROW(ConfigError, "config",
                   "--pp-virtual {} gives each pipeline rank chunks: it needs --pp-schedule "
                   "interleaved (got {})",
                   c.pp_virtual, c.pp_schedule);
    return;
  }
  check_interleaved(c.pp, c.pp_virtual, c.grad_accum);
  if (c.pp * c.pp_virtual > s.model.n_layer)
    MEMFIT_THROW(ConfigError, "config",
                 "--pp {} x --pp-virtual {} = {} chunks of at least one block each, but the model "
                 "has {} blocks",
                 c.pp, c.pp_virtual, c.pp * c.pp_virtual, s.model.n_layer);
  const bool counts = !c.pp_layers.empty() && c.pp_layers != "auto";
  if (const auto n = std::count(c.pp_layers.begin(), c.pp_layers.end(), ',') + 1;
      counts && n != c.pp * c.pp_virtual)
    MEMFIT_THROW(ConfigError, "config",
                 "--pp-layers {} gives {} counts; --pp-schedule interleaved needs one a chunk: "
                 "--pp {} x --pp-virtual {} = {}",
                 c.pp_layers, n, c.pp, c.pp_virtual, c.pp * c.pp_virtual);
  s.pipe_schedule = PipeSchedule::one_f_one_b;
  s.pipe_virtual = c.pp_virtual;
}

// --act-compress: as given; else, resuming, the checkpoint's (none before the field existed, or
// where it cannot be read: the trainer's resume check then names what is wrong); else none.
ActCompress run_act_compress(const TrainConfig& c, StartingCheckpoint& start) {
  if (!c.act_compress.empty()) return act_compress_from_name(c.act_compress);
  if (c.resume_dir.empty()) return ActCompress::none;
  const nlohmann::json& s = start.state();
  const auto it = s.find("act_compress");
  if (it == s.end() || !it->is_string()) return ActCompress::none;
  const std::string name = it->get<std::string>();
  return name == "int8" ? ActCompress::int8 : name == "fp8" ? ActCompress::fp8 : ActCompress::none;
}

}  // namespace

RunSpec resolve_run(const TrainConfig& c, io::CheckpointLocation* location) {
  StartingCheckpoint start(c);
  RunSpec s = resolve_run(c, start);
  if (location) *location = start.model().location;
  return s;
}

RunSpec resolve_run(const TrainConfig& c, StartingCheckpoint& start) {
  validate_train_config(c);
  const RunModel& run = start.model();
  RunSpec s;
  s.model = run.config;
  s.T = run.T;
  s.batch = c.batch;
  s.grad_accum = c.grad_accum;
  s.steps = c.steps;
  s.lora = c.lora;
  s.precision = run_precision(c.precision_options(), s.lora);  // LoRA's bf16 base: no master
  s.attention = attention_kind_from_name(c.attention);
  s.lm_head_group = c.lm_head_group;
  s.ckpt_auto = c.ckpt == "auto";
  if (!s.ckpt_auto) s.ckpt = CheckpointPolicy::parse(c.ckpt);
  s.act_compress = run_act_compress(c, start);
  s.act_compress_open = c.act_compress.empty() && c.resume_dir.empty();
  s.auto_batch = c.auto_batch;
  s.optim = c.optim;
  s.optim.n_head = run.config.n_head;
  s.optim.seed = c.seed;
  s.threads = c.threads;
  if (c.tp < 1 || c.ranks % c.tp != 0)
    MEMFIT_THROW(ConfigError, "config",
                 "--tp {} must divide the ranks ({}): each tensor group is --tp neighbouring "
                 "ranks, the data group the rest",
                 c.tp, c.ranks);
  if (c.tp > 1) s.model.set_tensor_parallel(c.tp);
  // --pp (Note [Pipeline parallel]): the cut and the schedule; the data group is the ranks /
  // (tp x pp). Every stage's rules are RunSpec::check_pipeline's.
  if (c.pp < 1 || c.ranks % (c.tp * c.pp) != 0)
    MEMFIT_THROW(ConfigError, "config",
                 "--pp {} must divide the ranks ({}{}): each pipeline group is --pp ranks, one a "
                 "stage, the data group the rest",
                 c.pp, c.ranks, c.tp > 1 ? fmt::format(" / --tp {}", c.tp) : std::string());
  if (c.pp > 1) {
    if (!c.init_from.empty() && s.model.tie_embeddings)
      MEMFIT_THROW(ConfigError, "config",
                   "--pp {} with --init-from of a tied model is not built yet: the last stage's "
                   "copy of the token table is not mapped from a checkpoint (Note [Pipeline "
                   "parallel], \"What remains\")",
                   c.pp);
    set_pipeline_schedule(s, c);
    s.pipeline = split_stages(c.pp_layers, s.model.n_layer, c.pp * s.pipe_virtual);
    // auto: the even split here, balanced by the planner's estimate once the run is resolved
    // (resolve_auto; memfit plan): the stages, or under interleaved the P x V chunks.
    s.pp_layers_auto = c.pp_layers.empty() || c.pp_layers == "auto";
  } else if (!c.pp_layers.empty() && c.pp_layers != "auto") {
    MEMFIT_THROW(ConfigError, "config",
                 "--pp-layers {} cuts the model into pipeline stages, so it needs --pp above 1",
                 c.pp_layers);
  } else {
    if (c.pp_schedule != "interleaved")
      (void)parse_pipe_schedule(c.pp_schedule);  // an unknown name is refused without --pp too
    if (c.pp_virtual != 1)
      MEMFIT_THROW(ConfigError, "config",
                   "--pp-virtual {} gives each pipeline rank chunks, so it needs --pp above 1 "
                   "and --pp-schedule interleaved",
                   c.pp_virtual);
  }
  s.world = c.ranks / (c.tp * c.pp);
  s.sp = c.sp;
  s.tp_overlap = parse_tp_overlap(c.tp_overlap);
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
  // The links the step-time estimate prices transfers on (plan/link_model.h).
  for (const std::string& l : c.links) parse_link(l, s.links);
  if (c.ranks_per_node < 0)
    MEMFIT_THROW(ConfigError, "config", "--ranks-per-node must be 1 or more (0: every rank on "
                 "one node), got {}", c.ranks_per_node);
  s.links.ranks_per_node = c.ranks_per_node;
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
  s.update_in_backward = c.update_in_backward;
  s.clip = c.clip;
  s.clip_mode = c.clip_mode == "unit" ? UnitSteps::Clip::unit : UnitSteps::Clip::global;
  s.check();
  return s;
}

namespace {

// A resumed run must keep the micro-batch it was saved with (the trainer refuses another), so
// --auto-batch keeps the checkpoint's. Without a readable trainer_state.json the search goes
// ahead and the trainer's own resume checks report what is wrong.
bool pin_resumed_batch(const TrainConfig& config, RunSpec& spec, std::string* note,
                       StartingCheckpoint& start) {
  const nlohmann::json& s = start.state();
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
SearchResult search_run(const TrainConfig& config, const RunSpec& spec, std::string* note,
                        StartingCheckpoint& start) {
  if (spec.mem_limit == 0)
    MEMFIT_THROW(ConfigError, "config",
                 "the planner's search needs a budget: give --mem-limit (e.g. 4GiB)");
  RunSpec base = spec;
  SearchSpace space = SearchSpace::of(spec);
  if (space.micro_batches && spec.resumed && pin_resumed_batch(config, base, note, start))
    space.micro_batches = false;
  if (spec.zero_auto && spec.world == 1 && note)
    *note += std::string(note->empty() ? "" : "; ") +
             "--zero auto with one rank: stage 0 (one process has nothing to shard; under "
             "mpirun -n N, or memfit plan --world-size N, the search chooses the stage)";
  // The layout too (plan --auto over several ranks, neither --tp nor --pp given).
  if (config.auto_layout && spec.world > 1 && spec.model.tp == 1 && spec.pp() == 1)
    return search_layouts(base, spec.mem_limit, space, [](const std::string& layout, int i, int n) {
      fmt::print(stderr, "memfit plan: layout {} of {}: {}\n", i, n, layout);
    });
  return search_training(base, spec.mem_limit, space);
}

}  // namespace

std::string resolve_precision(TrainConfig& config) {
  StartingCheckpoint start(config);
  return resolve_precision(config, start);
}

std::string resolve_precision(TrainConfig& config, StartingCheckpoint& start) {
  if (config.precision != "auto") return "";
  if (!config.resume_dir.empty()) {
    const nlohmann::json& s = start.state();
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
  StartingCheckpoint start(config);
  return search_run(config, spec, note, start);
}

SearchResult plan_auto(const TrainConfig& config, const RunSpec& spec, std::string* note,
                       StartingCheckpoint& start) {
  return search_run(config, spec, note, start);
}

AutoResolution resolve_auto(const TrainConfig& config) {
  StartingCheckpoint start(config);
  return resolve_auto(config, start);
}

AutoResolution resolve_auto(const TrainConfig& config, StartingCheckpoint& start) {
  AutoResolution r;
  TrainConfig c = config;
  r.precision_note = resolve_precision(c, start);
  r.asked = resolve_run(c, start);
  RunSpec run = r.asked;
  if (c.needs_planner()) {
    r.planned = true;
    r.search = search_run(c, r.asked, &r.note, start);
    if (!r.search.fits) {
      const Candidate& s = r.search.smallest;
      OutOfMemoryError e(detail::where(__FILE__, __LINE__), r.search.message, s.peak_bytes,
                         s.dominant(), r.search.limit, CategoryBytes{});
      e.set_advice(advise_fit(r.asked, r.search.limit).text());
      throw e;
    }
    run = apply_candidate(r.asked, r.search.choice);
  }
  // --pp-layers auto: the cut the planner balances (Note [Pipeline parallel], "The step's
  // time"); checked again as every cut is.
  if (run.pp() > 1 && run.pp_layers_auto) {
    const StageSplit split = balance_stages(run);
    run.pipeline = split.stages;
    run.check();
    r.pipeline_note = split.why;
  }
  r.train = train_spec(c, run, start);
  return r;
}

TrainSpec train_spec(const TrainConfig& c, const RunSpec& run, StartingCheckpoint& start) {
  TrainSpec t;
  t.run = run;
  t.checkpoint = start.checkpoint();
  // The preset, or where a checkpoint gave the model, the checkpoint.
  const std::string& from = !c.resume_dir.empty() ? c.resume_dir : c.init_from;
  t.model_label = !c.model.empty() || from.empty() ? c.model_name() : from;
  // A preset's vocabulary is the usual mismatch (gpt2-tiny's 512 on GPT-2 tokens): the loader's
  // error names it and the --vocab that fits. A checkpoint's model has its own.
  if (t.checkpoint.location.dir.empty())
    t.vocab_source = c.vocab ? "--vocab" : "preset " + c.model_name();
  t.schedule = c.schedule;
  t.schedule.total = c.steps;
  t.seed = c.seed;
  t.bucket_mb = c.bucket_mb;
  t.loss_scaler = c.loss_scaler;
  t.repeat_batch = c.repeat_batch;
  t.stop_after = c.stop_after;
  t.eval_every = c.eval_every;
  t.eval_batches = c.eval_batches;
  t.save_dir = c.save_dir;
  t.save_every = c.save_every;
  t.save_every_minutes = c.save_every_minutes;
  t.max_shard_bytes = io::parse_max_shard_size(c.max_shard_size);
  t.log_file = c.log_file;
  t.profile_dir = c.profile_dir;
  t.profile_steps = c.profile_steps;
  t.fail_on_leak = c.fail_on_leak;
  t.test_leak_bytes = c.test_leak_bytes;
  return t;
}

void adopt_lead_choice(AutoResolution& r, dist::Communicator& comm) {
  if (comm.size() == 1) return;
  if (r.planned) {
    std::string text = nlohmann::json(r.search.choice).dump();
    int64_t size = static_cast<int64_t>(text.size());
    comm.broadcast(&size, sizeof size, 0);
    text.resize(static_cast<size_t>(size));
    comm.broadcast(text.data(), size, 0);
    if (comm.rank() != 0) {
      const std::vector<PipelineStage> cut = r.train.run.pipeline;
      r.search.choice = nlohmann::json::parse(text).get<Candidate>();
      r.train.run = apply_candidate(r.asked, r.search.choice);
      r.train.run.pipeline = cut;
    }
  }
  // --pp-layers auto balances the stages by each process's calibration: rank 0's cut is every
  // rank's (every rank has the same --pp and --pp-layers, from one command line).
  if (RunSpec& run = r.train.run; run.pp() > 1 && run.pp_layers_auto) {
    std::vector<int32_t> counts;
    for (const PipelineStage& s : run.pipeline) counts.push_back(s.blocks());
    comm.broadcast(counts.data(), static_cast<int64_t>(counts.size() * sizeof(int32_t)), 0);
    std::string text;
    for (int32_t n : counts) text += fmt::format("{}{}", text.empty() ? "" : ",", n);
    run.pipeline = split_stages(text, run.model.n_layer, static_cast<int>(counts.size()));
  }
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
  // Under --tp the family's members are rounded so that each splits (plan/max_model.h).
  if (c.pp > 1)
    MEMFIT_THROW(ConfigError, "config",
                 "--max-model with --pp {} is not built: the search plans one model whole; plan "
                 "one shape with --pp (without --max-model)",
                 c.pp);
  // A fixed policy is planned for every member (none, full, selective, every:K), but a list of
  // blocks cannot hold at every depth.
  refuse(c.ckpt.rfind("layers:", 0) == 0, "--ckpt",
         "the depth, so a layers: list of blocks cannot hold for every member (give none, full, "
         "selective or every:K, or auto for each member's fastest)");
}

}  // namespace memfit
