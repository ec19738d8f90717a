// A run's checkpoint I/O (train/train_run.h): the weights initialised or loaded (with the
// optimizer state and trainer_state.json when resuming), and the saves: stage 0's whole weights
// and optimizer state, the streamed save from the offload files, and ZeRO's shard files staged
// by every rank (docs/notes/checkpoints.md).
#include <fmt/format.h>

#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/memory/rss.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

void TrainRun::load_or_init() {
  state_file = location.dir / "trainer_state.json";
  if (location.dir.empty()) {
    Transformer::MasterSink to_master_file;
    if (off && master)
      to_master_file = [&](const Transformer::RangeFill& fill) { off->write_master_from(fill); };
    gpt->init_weights(settings.seed, piece, to_master_file);
    return;
  }
  // trainer_state.json first: a resume configured unlike the checkpoint (another
  // --optim-state-dtype, LoRA options) is refused naming the option, before a weight or
  // optimizer file is read and fails on a dtype or a missing file instead.
  if (resume) load_trainer_state();
  load_weights();
  load_offloaded_state();
  if (resume && gpt->lora()) {  // the adapters and their optimizer's state (Note [LoRA])
    io::load_lora_adapter(location.dir, mc, *gpt->lora(), gpt->lora_weights());
    io::load_optimizer_state(location.dir / io::kAdapterOptimizerFile, *opt);
  } else if (gpt->lora() && !settings.checkpoint.lora_from.empty()) {  // --lora-from: no state
    io::load_lora_adapter(settings.checkpoint.lora_from, mc, *gpt->lora(), gpt->lora_weights());
  }
}

// Into the weights of record, converting F32 <-> BF16 as needed, then the working copy rounded
// from them: any precision loads any precision's checkpoint. The optimizer in RAM with them.
void TrainRun::load_weights() {
  // config.json as the run's resolution read it: checked against the model, not read again.
  const io::ReadCheckpoint saved{location.dir, settings.checkpoint.config};
  Transformer::MasterSink to_master_file;
  if (off && master)
    to_master_file = [&](const Transformer::RangeFill& fill) { off->write_master_from(fill); };
  if (gpt->whole_weights() && !to_master_file && !gpt->params_offloaded() &&
      io::has_model_weights(location.dir)) {
    // The whole layout, straight into the weights from the files. A stage-0 save's
    // optimizer.safetensors is checked with the weights, all before a byte is copied;
    // sharded state (any other range, or a ZeRO save) is loaded below.
    // LoRA's optimizer steps the adapters alone: its state is loaded with them.
    const bool with_opt = resume && opt && !gpt->lora() &&
                          opt->range() == whole_range(gpt->layout()) &&
                          !io::has_zero_shards(location.dir);
    io::load_checkpoint(saved, mc, gpt->layout(), gpt->weights(), with_opt ? opt.get() : nullptr);
    if (resume && opt && !with_opt && !gpt->lora())
      io::load_optimizer_state_any(location.dir, *opt);
    gpt->refresh_working();
  } else {
    // This rank's ranges of each tensor (model.safetensors, Hugging Face's shards, or a ZeRO
    // save's shard files of any world size and stage), read from the mapped files.
    const std::unique_ptr<io::ParamSource> source = io::open_checkpoint_weights(saved, mc);
    gpt->set_weights([&](int64_t from, int64_t to,
                         float* dst) { source->read_range({from, to}, dst); },
                     piece, to_master_file);
    // ZeRO's shards of any world size and stage, or a whole optimizer.safetensors, cut to
    // this rank's range (io/checkpoint/zero_checkpoint.h).
    if (resume && opt) io::load_optimizer_state_any(location.dir, *opt);
  }
}

// The offloaded optimizer's state, streamed into this rank's files.
void TrainRun::load_offloaded_state() {
  if (resume && off && (my_shard || io::has_zero_shards(location.dir))) {
    // A shard's part of any saved state (ZeRO's shards of any world size and stage, or a
    // whole optimizer.safetensors), streamed into this rank's files.
    off->load_state(io::SavedOptimizerState(location.dir, off->descriptor(), off->range()));
  } else if (resume && off) {
    const fs::path file = location.dir / io::kOptimizerFile;
    if (!fs::exists(file))
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: no {}, so the optimizer cannot resume (load the weights alone with "
                   "--init-from to start a fresh optimizer)",
                   location.dir.string(), io::kOptimizerFile);
    off->load_state(file);
  }
}

// Where the resumed run stands (step, data position, loss scale), and what it changes.
void TrainRun::load_trainer_state() {
  // The text read when the run was resolved (train_spec.h); read now only to report why it
  // could not be read then.
  const std::optional<std::string>& text = settings.checkpoint.state_text;
  const nlohmann::json run = run_state_json();
  resumed = parse_trainer_state(text ? *text : io::read_file_to_string(state_file), run,
                                state_file);
  start_step = resumed.step;
  data_position = resumed.data_position;
  if (scaler && resumed.state.contains("loss_scaler"))
    scaler->load_json(resumed.state["loss_scaler"]);
  if (const std::string note = longer_run_note(resumed, run); lead && !note.empty())
    fmt::print(stderr, "memfit: {}\n", note);
  if (const std::string changes = schedule_changes(resumed, run); lead && !changes.empty())
    fmt::print(stderr,
               "memfit: the learning-rate schedule differs from the checkpoint's ({}): it "
               "continues with this run's, so this is not a bit-identical continuation\n",
               changes);
}

// The weights of record, whole, where a save takes them from RAM (else empty: open_log).
Tensor TrainRun::record_for_save() {
  if (placement.sharded_save() || streamed_save) return Tensor{};
  return gpt->weights();
}

// ZeRO's sharded optimizer state (stage >= 1): every rank writes its own shard file (its range
// of the weights of record and its extents of every state tensor, straight from its tensors: no
// byte gathered or added) into a staging directory beside the save, a sibling of DIR on the same
// file system. A barrier, then rank 0's atomic save renames the shard files into its temporary
// directory and adds the index, so they change with the rest of the checkpoint
// (docs/notes/checkpoints.md, "ZeRO's sharded optimizer state"). Every rank calls this
// (collective); rank 0 saves.
void TrainRun::stage_shards() {
  if (!sharded_state) return;
  if (lead) {
    fs::remove_all(staging);  // a crashed save's leftovers
    fs::create_directories(staging);
  }
  comm.barrier();
  const fs::path file = staging / io::zero_shard_file(comm.rank(), W);
  if (off && master) {
    // Offloaded: the shard's master weights and state streamed out of this rank's files (the
    // same bytes as from RAM).
    off->save_shard(file);
  } else if (off && gpt->params_offloaded()) {
    // Without master weights, offloaded working weights (stage 3): the shard's streamed from
    // their file.
    off->save_shard(file, *zero.weights);
  } else if (off) {
    // Without master weights: the working weights (whole at stages 1-2, the shard itself at
    // stage 3) are the weights of record.
    off->save_shard(file, gpt->whole_weights() ? my_part(gpt->weights()) : gpt->weights());
  } else {
    const Tensor weights = gpt->whole_weights()
                               ? gpt->weights().view(my_shard->begin, {my_shard->size()})
                               : gpt->weights();
    io::save_zero_shard(file, *opt, weights);
  }
  comm.barrier();  // every shard is on disk before rank 0 moves them into the save
}

// The streamed weights of record: each run of the layout read from its file (a piece of the
// master file through the offload ring; a block of the working weights through the model's
// ring, the embeddings and the tail from RAM) and written to its places in model.safetensors;
// GPT-2's transposed tensors through the planned staging, held for the save alone
// (save_staging_elements).
io::StreamedWeights TrainRun::streamed_weights(Tensor& save_staging) {
  io::StreamedWeights w;
  w.dtype = record_dtype;
  if (off && master)
    w.stream = [this](ElementRange range, const io::RecordTake& take) {
      off->read_master_range(range, [&](int64_t from, int64_t to, const float* src) {
        take(from, to, src);
      });
    };
  else
    w.stream = [this](ElementRange range, const io::RecordTake& take) {
      zero.weights->read_range(
          range, [&](int64_t from, int64_t to, const char* src) { take(from, to, src); });
    };
  if (save_staging_n > 0)
    save_staging =
        Tensor::empty(pool, {save_staging_n}, DType::f32, Category::staging, "save.staging");
  w.staging = save_staging;
  return w;
}

// Rank 0's atomic save of step `step` (after stage_shards on every rank).
void TrainRun::save(int64_t step, const Tensor& record) {
  const auto save_start = std::chrono::steady_clock::now();
  io::CheckpointSaveOptions so;
  // A shard's optimizer state goes into the shard files (stage_shards); stage 0 saves the
  // whole state as optimizer.safetensors (every rank holds the same).
  so.optimizer = sharded_state || gpt->lora() ? nullptr : opt.get();
  // LoRA: the adapters in PEFT's format beside the (unchanged) base weights (Note [LoRA]).
  if (gpt->lora())
    so.write_extra = [&](const fs::path& tmp) {
      io::save_lora_adapter(tmp, mc, *gpt->lora(), gpt->lora_weights());
      io::save_optimizer_state(tmp / io::kAdapterOptimizerFile, *opt);
    };
  if (sharded_state)
    so.write_extra = [&](const fs::path& tmp) {
      for (int r = 0; r < W; ++r)
        fs::rename(staging / io::zero_shard_file(r, W), tmp / io::zero_shard_file(r, W));
      io::write_file_atomic(tmp / io::kZeroIndexFile,
                            io::zero_index_json(off ? off->descriptor() : *opt, placement));
    };
  // Offloaded: optimizer.safetensors streamed out of the files a unit at a time (the same
  // bytes as from RAM).
  if (off && !sharded_state)
    so.write_extra = [&](const fs::path& tmp) { off->save_state(tmp / io::kOptimizerFile); };
  if (sharded_state) so.sharded_weights_dtype = record_dtype;
  Tensor save_staging;
  if (streamed_save) so.streamed_weights = streamed_weights(save_staging);
  so.max_shard_bytes = settings.max_shard_bytes;
  // The writer's staging from RAM (GPT-2's Conv1D transposes, about 4 MiB at a time) comes
  // from the pool; the planner counts it for a run that saves (plan/memory_plan.cpp).
  so.staging_pool = &pool;
  so.extra_files["trainer_state.json"] = trainer_state_json(step).dump(2);
  // The weights of record: FP32 master weights when they exist, else the bf16 weights of a
  // pure-bf16 run (saved as BF16) or the fp32 ones.
  io::save_checkpoint(settings.save_dir, mc, gpt->layout(), record, so);
  so.streamed_weights.reset();
  save_staging = Tensor{};
  if (sharded_state) fs::remove(staging);  // emptied by the renames
  // Memory once the save has let go of what it used: the soak benchmark's samples.
  // (And how long rank 0's part of the save took: the streamed save's, with offload.)
  log_line({{"step", step}, {"saved", settings.save_dir},
            {"save_seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start)
                 .count()},
            {"live_bytes", pool.bytes_current()},
            {"live_allocations", pool.live_allocations()}, {"rss_bytes", process_rss_bytes()},
            {"mem", memory_json(pool.current_breakdown())}});
}

// --save-every and --save-every-minutes: a save after step `step` where one is due (not after
// the last: the loop's end saves that).
void TrainRun::save_if_due(int64_t step, bool last) {
  const double minutes_since_save =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count() / 60;
  bool due = (settings.save_every && step % settings.save_every == 0) ||
             (settings.save_every_minutes > 0 && minutes_since_save >= settings.save_every_minutes);
  // Sharded master weights are gathered, and sharded state written, by every rank for a save
  // (collectives): the ranks' clocks must not decide apart, so rank 0's decision is everyone's.
  if ((!gpt->whole_weights() || sharded_state) && !settings.save_dir.empty() &&
      settings.save_every_minutes > 0) {
    char d = due;
    comm.broadcast(&d, 1, 0);
    due = d != 0;
  }
  if (!settings.save_dir.empty() && due && !last) {
    const profile::Scope slice(recorder(), "save", profile::SliceKind::save);
    const Tensor record = record_for_save();
    stage_shards();
    if (lead) save(step, record);
    saved_at = step;
    last_save = std::chrono::steady_clock::now();
  }
}

}  // namespace memfit
