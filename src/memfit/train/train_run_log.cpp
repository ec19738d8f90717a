// A run's log and profile (train/train_run.h): rank 0's JSON lines (a line per step with the
// loss, the gradient norm, memory, the collectives' and the offload files' bytes; every rank's
// peak at the end), the progress line's text, trainer_state.json for the saves, and the run as
// the profile describes it.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "memfit/io/atomic_file.h"
#include "memfit/memory/rss.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

json memory_json(const CategoryBytes& bytes) {
  json j = json::object();
  for (Category c : kAllCategories)
    if (const size_t b = bytes[static_cast<size_t>(c)]) j[std::string(category_name(c))] = b;
  return j;
}

json run_json(const TrainSpec& t, const StatePlacement& placement) {
  const RunSpec& spec = t.run;
  const int rank = placement.rank(), ranks = placement.world();
  const ModelConfig& m = spec.model;
  const std::string& model = t.model_label;
  const std::string shape = fmt::format("{} x {}", m.n_layer, m.d_model);
  return {{"title", fmt::format("{} ({}), {} x {} tokens{}, {}, --ckpt {}{}", model, shape,
                                spec.batch, spec.T,
                                spec.grad_accum > 1 ? fmt::format(" x {}", spec.grad_accum) : "",
                                precision_name(spec.precision.precision), spec.ckpt.name(),
                                ranks > 1 ? fmt::format(", rank {} of {}{}", rank, ranks,
                                                        placement.stage() > 0
                                                            ? fmt::format(", --zero {}",
                                                                          placement.stage())
                                                            : "")
                                          : "")},
          {"model", model},
          {"family", std::string(family_name(m.family))},
          {"n_layer", m.n_layer},
          {"d_model", m.d_model},
          {"n_head", m.n_head},
          {"batch", spec.batch},
          {"seq_len", spec.T},
          {"grad_accum", spec.grad_accum},
          {"precision", std::string(precision_name(spec.precision.precision))},
          {"ckpt", spec.ckpt.name()},
          {"attention", std::string(attention_kind_name(spec.attention))},
          {"optim", spec.optim.name},
          {"rank", rank},
          {"ranks", ranks},
          {"zero", placement.stage()}};
}

double unigram_entropy(io::DataLoader& loader, int vocab) {
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  const int64_t n = loader.num_tokens();
  loader.scan([&](std::span<const int32_t> tokens) {
    for (int32_t t : tokens) ++counts[t];
  });
  double h = 0;
  for (int64_t k : counts)
    if (k) h -= double(k) / n * std::log(double(k) / n);
  return h;
}

void truncate_log_after(const std::string& file, int64_t step) {
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= step)
      kept += line + '\n';
  }
  io::write_file_atomic(file, kept);
}

void TrainRun::log_line(const json& j) {
  if (lead_ && log_.is_open()) log_ << j.dump() << '\n' << std::flush;
}

TrainRun::IoMark TrainRun::io_mark() const {
  return {optimizer_io(), grads_file_ ? grads_file_->stats() : offload::IoStats{}, params_io(),
          grads_file_ ? grads_file_->backward_bytes() : 0};
}

// The offloaded optimizer's counters: the run's, and under --pp-schedule interleaved every
// chunk's added (each chunk streams its own files).
offload::IoStats TrainRun::optimizer_io() const {
  offload::IoStats io = off_ ? off_->stats() : offload::IoStats{};
  for (const auto& k : chunks_)
    if (k->off) {
      const offload::IoStats c = k->off->stats();
      io.bytes_read += c.bytes_read;
      io.bytes_written += c.bytes_written;
      io.wait_seconds += c.wait_seconds;
      io.update_seconds += c.update_seconds;
    }
  return io;
}

// The working weights' files' counters, every chunk's added as optimizer_io's.
offload::ParamIoStats TrainRun::params_io() const {
  offload::ParamIoStats io = offload::param_io_stats(param_file_.get());
  for (const auto& k : chunks_) {
    const offload::ParamIoStats c = offload::param_io_stats(k->param_file.get());
    io.read_bytes += c.read_bytes;
    io.written_bytes += c.written_bytes;
    io.wait_seconds += c.wait_seconds;
  }
  return io;
}

// The offload files' bytes by category (master, optimizer; params with --offload-params, grads
// with --offload-grads); every chunk's under --pp-schedule interleaved.
CategoryBytes TrainRun::offload_files() const {
  CategoryBytes disk = off_ ? off_->file_bytes() : CategoryBytes{};
  for (const auto& k : chunks_)
    if (k->off) {
      const CategoryBytes files = k->off->file_bytes();
      for (size_t c = 0; c < disk.size(); ++c) disk[c] += files[c];
    }
  if (param_file_)
    disk[static_cast<size_t>(Category::params)] += fs::file_size(param_file_->file().path());
  for (const auto& k : chunks_)
    if (k->param_file)
      disk[static_cast<size_t>(Category::params)] += fs::file_size(k->param_file->file().path());
  if (grads_file_)
    disk[static_cast<size_t>(Category::grads)] += fs::file_size(grads_file_->file().path());
  return disk;
}

// --offload-params under --profile: the waits for the working weights' file, as io slices
// inside the slice open when they are handed over (a micro-batch's, the optimizer's).
void TrainRun::params_io_waits() {
  if (!param_file_) return;
  for (const offload::IoWait& w : param_file_->take_waits())
    if (profile::StepRecorder* r = recorder())
      r->add("params io wait", profile::SliceKind::io_wait, w.t0, w.t1);
}

// This step's offload I/O: bytes moved, and the time the update waited for the disk. With
// --offload-params the working weights' file too (its reads during the micro-batches, the
// update's write-back), also apart under "params"; with --offload-grads the gradients' (the
// backward's writes and reads back, the update's reads), also apart under "grads".
json TrainRun::offload_line(const IoMark& before) {
  // (LoRA's frozen base on disk: its file alone, no optimizer's.)
  const offload::IoStats io = optimizer_io();
  const offload::ParamIoStats p = params_io() - before.params;
  const offload::IoStats g = grads_file_ ? grads_file_->stats() : offload::IoStats{};
  const uint64_t g_read = g.bytes_read - before.grads.bytes_read,
                 g_written = g.bytes_written - before.grads.bytes_written;
  const uint64_t read = io.bytes_read - before.optimizer.bytes_read + p.read_bytes + g_read,
                 written = io.bytes_written - before.optimizer.bytes_written + p.written_bytes +
                           g_written;
  last_step_io_ = read + written;
  json o = {{"read_bytes", read},
            {"written_bytes", written},
            {"wait_seconds", io.wait_seconds - before.optimizer.wait_seconds},
            {"update_seconds", io.update_seconds - before.optimizer.update_seconds},
            {"engine", off_ ? off_->engine().name() : param_file_->engine().name()}};
  if (param_file_)
    o["params"] = {{"read_bytes", p.read_bytes},
                   {"written_bytes", p.written_bytes},
                   {"wait_seconds", p.wait_seconds}};
  if (grads_file_)
    o["grads"] = {{"read_bytes", g_read},
                  {"written_bytes", g_written},
                  {"wait_seconds", g.wait_seconds - before.grads.wait_seconds},
                  {"backward_bytes", grads_file_->backward_bytes() - before.grads_backward}};
  return o;
}

// The step's line of the log (every rank computes it: the collectives' volume is taken and the
// skipped steps counted on each).
void TrainRun::log_step(int64_t step, const StepResult& r) {
  const size_t rss = process_rss_bytes();
  json line = {{"step", step + 1},          {"loss", r.loss},
               {"lr", r.lr},                {"grad_norm", r.update.grad_norm},
               {"tokens_per_s", r.rate},    {"step_seconds", r.seconds},
               {"peak_bytes", pool_.bytes_peak()}, {"mem", memory_json(pool_.current_breakdown())},
               {"live_bytes", pool_.bytes_current()},
               {"live_allocations", pool_.live_allocations()},
               {"rss_bytes", rss},
               {"outside_pool_bytes", int64_t(rss) - int64_t(pool_.bytes_current())}};
  if (W_ > 1) {
    // The bytes this step's collectives covered, by kind (plan: comm_per_step).
    dist::CommVolume v = sync_ ? sync_->take_volume() : zero_.grads->take_volume();
    // Stage 3: the step's gathers of working weights (the micro-batches' blocks, the
    // persistent units after the update).
    v.all_gather = r.update.gathered_bytes + r.update_gathered + gpt_->take_gathered_bytes();
    for (auto& k : chunks_) {  // --pp-schedule interleaved: the other chunks' collectives
      const dist::CommVolume c = k->sync ? k->sync->take_volume() : k->zero.grads->take_volume();
      v.all_reduce += c.all_reduce;
      v.reduce_scatter += c.reduce_scatter;
      v.all_gather += k->gpt->take_gathered_bytes();
    }
    line["comm_bytes"] = {{"all_reduce", v.all_reduce},
                          {"reduce_scatter", v.reduce_scatter},
                          {"all_gather", v.all_gather}};
  }
  if (mc_.tp > 1) {  // --tp: the tensor group's (plan: tensor_comm_per_step)
    line["tensor_comm_bytes"] = {{"all_reduce", r.tensor_comm.all_reduce_bytes},
                                 {"all_reduce_count", r.tensor_comm.all_reduce_count},
                                 {"gathered", r.tensor_comm.gathered_bytes}};
    line["tensor_comm_s"] = r.tensor_comm.seconds;  // wall time in them (measured, this rank)
    if (spec_.tp_overlap) {  // of which on the communication thread; what the step waited
      line["tensor_comm_overlapped_s"] = r.tensor_comm.overlapped_seconds;
      line["tensor_comm_exposed_s"] = r.tensor_comm.exposed_seconds();
    }
    if (r.tensor_comm.reduce_scatter_count > 0) {  // --sp
      line["tensor_comm_bytes"]["reduce_scatter"] = r.tensor_comm.reduce_scatter_bytes;
      line["tensor_comm_bytes"]["reduce_scatter_count"] = r.tensor_comm.reduce_scatter_count;
    }
  }
  if (off_ || param_file_) line["offload"] = offload_line(r.before);
  if (scaler_) {
    line["loss_scale"] = r.loss_scale;
    line["skipped"] = r.update.skipped;
    if (r.update.skipped) line["grad_norm"] = nullptr;
    summary_.skipped_steps += r.update.skipped;
  }
  log_line(line);
}

std::string TrainRun::progress_text(const StepResult& r) const {
  std::string text = fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s | mem {} (peak {})",
                                 r.loss, r.lr, r.rate, format_mib(pool_.bytes_current()),
                                 format_mib(pool_.bytes_peak()));
  if (scaler_)
    text += fmt::format(" | scale {:g}{}", r.loss_scale, r.update.skipped ? " (skipped)" : "");
  return text;
}

// Every rank's peak by category, in rank 0's log: what `memfit plan --world-size W` predicts
// per rank (ZeRO shards and receive buffers differ between ranks). With offload also each
// rank's files by category and its last step's I/O (the plan's per-rank offload section).
void TrainRun::log_rank_peaks() {
  struct RankPeak {
    size_t peak;
    CategoryBytes by_category;
    CategoryBytes disk;
    uint64_t io_bytes;
  };
  // Every rank of the world: the data group's, and under --tp each tensor rank (world rank q
  // is data rank q / tp's slice q % tp: Note [Process grid]).
  dist::Communicator& world = grid_.world();
  const int n = world.size();
  std::vector<RankPeak> peaks(static_cast<size_t>(n));
  RankPeak& mine = peaks[static_cast<size_t>(world.rank())];
  mine = {pool_.bytes_peak(), pool_.peak_breakdown(), offload_files(), last_step_io_};
  world.all_gather(&mine, peaks.data(), std::vector<int64_t>(static_cast<size_t>(n), 1),
                   sizeof(RankPeak));
  json ranks = json::array();
  for (int q = 0; q < n; ++q) {
    const RankPeak& p = peaks[static_cast<size_t>(q)];
    json rank = {{"rank", q}, {"peak_bytes", p.peak}, {"mem", memory_json(p.by_category)}};
    if (off_ || param_file_)
      rank["offload"] = {{"disk", memory_json(p.disk)}, {"io_bytes_per_step", p.io_bytes}};
    ranks.push_back(std::move(rank));
  }
  log_line({{"zero", placement_.stage()}, {"ranks", ranks}});
}

// What a resumed run must agree with (parse_trainer_state compares these with a checkpoint's).
json TrainRun::run_state_json() const {
  const RunSpec& c = spec_;
  json s = {{"seed", settings_.seed},
            {"batch", c.batch},
            {"grad_accum", c.grad_accum},
            {"seq_len", T_},
            {"steps", c.steps},
            {"shuffle", c.shuffle},
            {"repeat_batch", settings_.repeat_batch},
            {"optim", c.optim.name},
            {"optim_state_dtype", std::string(optim_state_dtype_name(c.optim.state_dtype))},
            {"attention", std::string(attention_kind_name(c.attention))},
            {"ckpt", c.ckpt.name()},
            {"act_compress", std::string(act_compress_name(c.act_compress))},
            {"precision", std::string(precision_name(c.precision.precision))},
            {"zero", c.zero},
            {"master_weights", c.precision.master_weights ? "fp32" : "none"},
            {"schedule", settings_.schedule.to_json()}};
  // APOLLO's and GaLore's projections: the state's shape and the projections follow them.
  if (is_apollo(c.optim.name) || is_galore(c.optim.name)) {
    s["optim_rank"] = c.optim.rank;
    s["optim_proj_gap"] = c.optim.proj_gap;
  }
  if (c.lora.enabled())
    s["lora"] = {{"rank", c.lora.rank}, {"alpha", c.lora.alpha}, {"targets", c.lora.targets}};
  // A quantized base: a resume must quantize nothing again (the save's NF4 or int8 base is
  // read back as it is).
  if (const auto quant = c.lora.base_quant(); c.lora.enabled() && quant)
    s["lora"]["base_dtype"] = std::string(kernels::weight_quant_name(*quant));
  return s;
}

// The run's settings, and where it stands. No random numbers are drawn during training other
// than through the data order, which is a function of (seed, epoch), so the seed and the
// loader's position are the whole RNG state.
json TrainRun::trainer_state_json(int64_t step) const {
  json s = run_state_json();
  s["step"] = step;
  s["data_position"] = train_data_ ? train_data_->position() : data_position_;
  s["rng"] = {{"kind", "data order: mt19937_64 Fisher-Yates per epoch"}, {"seed", settings_.seed}};
  if (scaler_) s["loss_scaler"] = scaler_->to_json();
  // The training data's size, which a resume checks (-1: not known, no loader and an older file).
  if (const int64_t tokens = train_data_ ? train_data_->num_tokens() : resumed_.data_tokens;
      tokens >= 0)
    s["data_tokens"] = tokens;
  // The data's tokenizer (its dataset.json's), which memfit sample then decodes with.
  if (!data_tokenizer_.empty()) s["tokenizer"] = data_tokenizer_;
  return s;
}

// The summary's totals, the profile's files and the leak report, once the steps are done.
void TrainRun::finish_summary() {
  if (!rates_.empty()) {
    std::sort(rates_.begin(), rates_.end());
    summary_.median_tokens_per_s = rates_[rates_.size() / 2];
  }
  summary_.rank = comm_.rank();
  summary_.ckpt = spec_.ckpt.name();
  summary_.act_compress = act_compress_name(spec_.act_compress);
  summary_.batch = spec_.batch;
  summary_.grad_accum = spec_.grad_accum;
  summary_.peak_bytes = pool_.bytes_peak();
  summary_.peak_by_category = pool_.peak_breakdown();
  if (profiler_) {
    gpt_->set_step_observer(nullptr);
    profiler_->finish();  // a run shorter than the window
    summary_.profile_dir = profiler_->dir().string();
    summary_.profile_text = profiler_->text();
  }
  summary_.leak = leaks_.report();
  if (profiler_)
    io::write_file_atomic(profiler_->dir() / "leak.json", summary_.leak.to_json().dump(1));
  summary_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
}

}  // namespace memfit
