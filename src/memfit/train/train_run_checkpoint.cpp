// A run's checkpoint I/O (train/train_run.h): the weights initialised or loaded (with the
// optimizer state and trainer_state.json when resuming), and the saves: stage 0's whole weights
// and optimizer state, the streamed save from the offload files, and ZeRO's shard files staged
// by every rank (docs/notes/checkpoints.md).
#include <fmt/format.h>

#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/quant_base_file.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/memory/rss.h"
#include "memfit/model/layout_map.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

void TrainRun::load_or_init() {
  state_file_ = location_.dir / "trainer_state.json";
  if (location_.dir.empty()) {
    Transformer::MasterSink to_master_file;
    if (off_ && master_)
      to_master_file = [&](const Transformer::RangeFill& fill) { off_->write_master_from(fill); };
    gpt_->init_weights(settings_.seed, piece_, to_master_file);
    return;
  }
  // trainer_state.json first: a resume configured unlike the checkpoint (another
  // --optim-state-dtype, LoRA options) is refused naming the option, before a weight or
  // optimizer file is read and fails on a dtype or a missing file instead.
  if (resume_) load_trainer_state();
  load_weights();
  load_offloaded_state();
  if (resume_ && gpt_->lora()) {  // the adapters and their optimizer's state (Note [LoRA])
    load_adapters(location_.dir);
    load_adapter_state(location_.dir);
  } else if (gpt_->lora() && !settings_.checkpoint.lora_from.empty()) {  // --lora-from: no state
    load_adapters(settings_.checkpoint.lora_from);
  }
}

// Into the weights of record, converting F32 <-> BF16 as needed, then the working copy rounded
// from them: any precision loads any precision's checkpoint. The optimizer in RAM with them.
void TrainRun::load_weights() {
  // --tp or --pp: each rank's slices and stage of the whole tensors (train_run_layout.cpp).
  if (layout_split(mc_)) {
    load_by_layout();
    return;
  }
  // config.json as the run's resolution read it: checked against the model, not read again.
  const io::ReadCheckpoint saved{location_.dir, settings_.checkpoint.config};
  Transformer::MasterSink to_master_file;
  if (off_ && master_)
    to_master_file = [&](const Transformer::RangeFill& fill) { off_->write_master_from(fill); };
  if (gpt_->whole_weights() && !to_master_file && !gpt_->params_offloaded() &&
      !gpt_->quant_base() && io::has_model_weights(location_.dir)) {
    // The whole layout, straight into the weights from the files. A stage-0 save's
    // optimizer.safetensors is checked with the weights, all before a byte is copied;
    // sharded state (any other range, or a ZeRO save) is loaded below.
    // LoRA's optimizer steps the adapters alone: its state is loaded with them.
    const bool with_opt = resume_ && opt_ && !gpt_->lora() &&
                          opt_->range() == whole_range(gpt_->layout()) &&
                          !io::has_zero_shards(location_.dir);
    io::load_checkpoint(saved, mc_, gpt_->layout(), gpt_->weights(),
                        with_opt ? opt_.get() : nullptr);
    if (resume_ && opt_ && !with_opt && !gpt_->lora())
      io::load_optimizer_state_any(location_.dir, *opt_);
    gpt_->refresh_working();
  } else {
    // This rank's ranges of each tensor (model.safetensors, Hugging Face's shards, or a ZeRO
    // save's shard files of any world size and stage), read from the mapped files.
    const std::unique_ptr<io::ParamSource> source = io::open_checkpoint_weights(saved, mc_);
    // A quantized base's resume (Note [NF4 weights], "QLoRA"): the NF4 or int8 linears
    // exactly as saved, the rest from model.safetensors; an --init-from quantizes them from it.
    if (const QuantBaseLayout* quant = gpt_->quant_base(); resume_ && quant) {
      const std::string name = io::quant_base_file(quant->format());
      const fs::path file = location_.dir / name;
      if (!fs::exists(file))
        MEMFIT_THROW(IoError, "checkpoint",
                     "{}: no {}, so --base-dtype {} cannot resume bit for bit (start from it "
                     "with --init-from, which quantizes its model.safetensors again)",
                     location_.dir.string(), name,
                     kernels::weight_quant_name(quant->format()));
      gpt_->set_weights_except_quant_base(
          [&](int64_t from, int64_t to, float* dst) { source->read_range({from, to}, dst); },
          piece_);
      io::load_quant_base(file, *quant, gpt_->quant_buffer());
      return;
    }
    gpt_->set_weights([&](int64_t from, int64_t to,
                         float* dst) { source->read_range({from, to}, dst); },
                     piece_, to_master_file);
    // ZeRO's shards of any world size and stage, or a whole optimizer.safetensors, cut to
    // this rank's range (io/checkpoint/zero_checkpoint.h).
    if (resume_ && opt_ && !gpt_->lora()) io::load_optimizer_state_any(location_.dir, *opt_);
  }
}

// The offloaded optimizer's state, streamed into this rank's files.
void TrainRun::load_offloaded_state() {
  if (layout_split(mc_)) return;  // through the layout map (load_by_layout)
  if (resume_ && off_ && (my_shard_ || io::has_zero_shards(location_.dir))) {
    // A shard's part of any saved state (ZeRO's shards of any world size and stage, or a
    // whole optimizer.safetensors), streamed into this rank's files.
    off_->load_state(io::SavedOptimizerState(location_.dir, off_->descriptor(), off_->range()));
  } else if (resume_ && off_) {
    const fs::path file = location_.dir / io::kOptimizerFile;
    if (!fs::exists(file))
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: no {}, so the optimizer cannot resume (load the weights alone with "
                   "--init-from to start a fresh optimizer)",
                   location_.dir.string(), io::kOptimizerFile);
    off_->load_state(file);
  }
}

// Where the resumed run stands (step, data position, loss scale), and what it changes.
void TrainRun::load_trainer_state() {
  // The text read when the run was resolved (train_spec.h); read now only to report why it
  // could not be read then.
  const std::optional<std::string>& text = settings_.checkpoint.state_text;
  const nlohmann::json run = run_state_json();
  resumed_ = parse_trainer_state(text ? *text : io::read_file_to_string(state_file_), run,
                                state_file_);
  start_step_ = resumed_.step;
  data_position_ = resumed_.data_position;
  if (scaler_ && resumed_.state.contains("loss_scaler"))
    scaler_->load_json(resumed_.state["loss_scaler"]);
  if (const std::string note = longer_run_note(resumed_, run); lead_ && !note.empty())
    fmt::print(stderr, "memfit: {}\n", note);
  if (const std::string changes = schedule_changes(resumed_, run); lead_ && !changes.empty())
    fmt::print(stderr,
               "memfit: the learning-rate schedule differs from the checkpoint's ({}): it "
               "continues with this run's, so this is not a bit-identical continuation\n",
               changes);
}

// The weights of record, whole, where a save takes them from RAM (else empty: open_log).
Tensor TrainRun::record_for_save() {
  if (sharded_state_ || streamed_save_ || layout_save_) return Tensor{};
  return gpt_->weights();
}

// ZeRO's sharded optimizer state (stage >= 1): every rank writes its own shard file (its range
// of the weights of record and its extents of every state tensor, straight from its tensors: no
// byte gathered or added) into a staging directory beside the save, a sibling of DIR on the same
// file system. A barrier, then rank 0's atomic save renames the shard files into its temporary
// directory and adds the index, so they change with the rest of the checkpoint
// (docs/notes/checkpoints.md, "ZeRO's sharded optimizer state"). Every rank calls this
// (collective); rank 0 saves.
void TrainRun::stage_shards() {
  if (layout_save_) {
    stage_layout_files();
    return;
  }
  if (!sharded_state_) return;
  if (lead_) {
    fs::remove_all(staging_);  // a crashed save's leftovers
    fs::create_directories(staging_);
  }
  comm_.barrier();
  const fs::path file = staging_ / io::zero_shard_file(comm_.rank(), W_);
  if (off_ && master_) {
    // Offloaded: the shard's master weights and state streamed out of this rank's files (the
    // same bytes as from RAM).
    off_->save_shard(file);
  } else if (off_ && gpt_->params_offloaded()) {
    // Without master weights, offloaded working weights (stage 3): the shard's streamed from
    // their file.
    off_->save_shard(file, *zero_.weights);
  } else if (off_) {
    // Without master weights: the working weights (whole at stages 1-2, the shard itself at
    // stage 3) are the weights of record.
    off_->save_shard(file, gpt_->whole_weights() ? my_part(gpt_->weights()) : gpt_->weights());
  } else if (base_record_ && gpt_->params_offloaded()) {
    // LoRA at stage 3 with the base on disk: the frozen base's shard streamed from its file
    // (the persistent units' parts from RAM), the same bytes as from RAM; no state.
    io::SafetensorsWriter writer;
    WeightGather& base = *zero_.weights;
    const ElementRange R = base_record_->range();
    if (R.size() > 0)
      writer.add_source(std::string(io::kZeroWeightsKey), io::safetensors_dtype_of(base.dtype()),
                        {R.size()}, [&base](const io::SafetensorsWriter::ByteSink& sink) {
                          base.read_mine([&](const char* buf, size_t bytes) { sink(buf, bytes); });
                        });
    io::set_zero_shard_metadata(writer, base_record_->name(), base_record_->steps_taken(), R);
    writer.write(file);
  } else if (base_record_) {  // LoRA at stage 3: the frozen base's shard, no state
    io::save_zero_shard(file, *base_record_, gpt_->weights());
  } else {
    const Tensor weights = gpt_->whole_weights()
                               ? gpt_->weights().view(my_shard_->begin, {my_shard_->size()})
                               : gpt_->weights();
    io::save_zero_shard(file, *opt_, weights);
  }
  comm_.barrier();  // every shard is on disk before rank 0 moves them into the save
}

// The streamed weights of record: each run of the layout read from its file (a piece of the
// master file through the offload ring; a block of the working weights through the model's
// ring, the embeddings and the tail from RAM) and written to its places in model.safetensors;
// GPT-2's transposed tensors through the planned staging, held for the save alone
// (save_staging_elements).
io::StreamedWeights TrainRun::streamed_weights(Tensor& save_staging) {
  io::StreamedWeights w;
  w.dtype = record_dtype_;
  if (gpt_->quant_base()) {  // NF4 or int8: the base dequantized (Note [NF4 weights], "QLoRA")
    save_quant_staging_ = Tensor::empty(pool_, {save_quant_n_}, DType::f32, Category::staging,
                                        "save.quant");
    w.stream = [this](ElementRange range, const io::RecordTake& take) {
      gpt_->read_base_range(range, take, save_quant_staging_);
    };
  } else if (off_ && master_)
    w.stream = [this](ElementRange range, const io::RecordTake& take) {
      off_->read_master_range(range, [&](int64_t from, int64_t to, const float* src) {
        take(from, to, src);
      });
    };
  else
    w.stream = [this](ElementRange range, const io::RecordTake& take) {
      zero_.weights->read_range(
          range, [&](int64_t from, int64_t to, const char* src) { take(from, to, src); });
    };
  if (save_staging_n_ > 0)
    save_staging =
        Tensor::empty(pool_, {save_staging_n_}, DType::f32, Category::staging, "save.staging");
  w.staging = save_staging;
  return w;
}

// Rank 0's atomic save of step `step` (after stage_shards on every rank).
void TrainRun::save(int64_t step, const Tensor& record) {
  const auto save_start = std::chrono::steady_clock::now();
  io::CheckpointSaveOptions so;
  // A shard's optimizer state goes into the shard files (stage_shards); stage 0 saves the
  // whole state as optimizer.safetensors (every rank holds the same).
  so.optimizer = sharded_state_ || layout_save_ || gpt_->lora() ? nullptr : opt_.get();
  // LoRA: the adapters in PEFT's format beside the (unchanged) base weights (Note [LoRA]).
  if (gpt_->lora())
    so.write_extra = [&](const fs::path& tmp) {
      save_adapters(tmp);
      if (const QuantBaseLayout* quant = gpt_->quant_base())
        io::save_quant_base(tmp / io::quant_base_file(quant->format()), *quant,
                            gpt_->quant_buffer());
    };
  if (sharded_state_) {
    auto lora_files = std::move(so.write_extra);
    so.write_extra = [&, lora_files](const fs::path& tmp) {
      if (lora_files) lora_files(tmp);
      for (int r = 0; r < W_; ++r)
        fs::rename(staging_ / io::zero_shard_file(r, W_), tmp / io::zero_shard_file(r, W_));
      const Optimizer& record = base_record_ ? *base_record_ : off_ ? off_->descriptor() : *opt_;
      io::write_file_atomic(tmp / io::kZeroIndexFile, io::zero_index_json(record, placement_));
    };
  }
  // Offloaded: optimizer.safetensors streamed out of the files a unit at a time (the same
  // bytes as from RAM).
  // (A split layout's offloaded state is staged with the weights: stage_layout_files.)
  if (off_ && !sharded_state_ && !layout_save_)
    so.write_extra = [&](const fs::path& tmp) { off_->save_state(tmp / io::kOptimizerFile); };
  // A split layout: every file of the weights and the optimizer state staged by the ranks
  // (stage_layout_files), moved in; config.json is the whole model's.
  // (LoRA: the adapters' files, gathered whole, beside them.)
  if (layout_save_) {
    auto lora_files = std::move(so.write_extra);
    so.write_extra = [&, lora_files](const fs::path& tmp) {
      layout_files().move(staging_, tmp);
      if (lora_files) lora_files(tmp);
    };
  }
  if (sharded_state_ || layout_save_) so.sharded_weights_dtype = record_dtype_;
  Tensor save_staging;
  if (streamed_save_) so.streamed_weights = streamed_weights(save_staging);
  so.max_shard_bytes = settings_.max_shard_bytes;
  // The writer's staging from RAM (GPT-2's Conv1D transposes, about 4 MiB at a time) comes
  // from the pool; the planner counts it for a run that saves (plan/memory_plan.cpp).
  so.staging_pool = &pool_;
  so.extra_files["trainer_state.json"] = trainer_state_json(step).dump(2);
  // The weights of record: FP32 master weights when they exist, else the bf16 weights of a
  // pure-bf16 run (saved as BF16) or the fp32 ones.
  if (layout_save_) {
    const ModelConfig whole = whole_run_model(mc_);
    io::save_checkpoint(settings_.save_dir, whole, ParamLayout(whole), record, so);
  } else {
    io::save_checkpoint(settings_.save_dir, mc_, gpt_->layout(), record, so);
  }
  so.streamed_weights.reset();
  save_staging = Tensor{};
  save_quant_staging_ = Tensor{};
  if (sharded_state_ || layout_save_) fs::remove(staging_);  // emptied by the renames
  // Memory once the save has let go of what it used: the soak benchmark's samples.
  // (And how long rank 0's part of the save took: the streamed save's, with offload.)
  log_line({{"step", step}, {"saved", settings_.save_dir},
            {"save_seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start)
                 .count()},
            {"live_bytes", pool_.bytes_current()},
            {"live_allocations", pool_.live_allocations()}, {"rss_bytes", process_rss_bytes()},
            {"mem", memory_json(pool_.current_breakdown())}});
}

// --save-every and --save-every-minutes: a save after step `step` where one is due (not after
// the last: the loop's end saves that).
void TrainRun::save_if_due(int64_t step, bool last) {
  const double minutes_since_save =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() / 60;
  bool due = (settings_.save_every && step % settings_.save_every == 0) ||
             (settings_.save_every_minutes > 0 &&
              minutes_since_save >= settings_.save_every_minutes);
  // Sharded master weights are gathered, and sharded state written, by every rank for a save
  // (collectives): the ranks' clocks must not decide apart, so rank 0's decision is everyone's.
  // A split layout's save is every rank's (the world's rank 0 decides for the world).
  if ((!gpt_->whole_weights() || sharded_state_ || layout_save_) && !settings_.save_dir.empty() &&
      settings_.save_every_minutes > 0) {
    char d = due;
    (layout_save_ ? grid_.world() : comm_).broadcast(&d, 1, 0);
    due = d != 0;
  }
  if (!settings_.save_dir.empty() && due && !last) {
    const profile::Scope slice(recorder(), "save", profile::SliceKind::save);
    const Tensor record = record_for_save();
    stage_shards();
    if (lead_) save(step, record);
    saved_at_ = step;
    last_save_ = std::chrono::steady_clock::now();
  }
}

}  // namespace memfit
