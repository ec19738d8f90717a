// A run's checkpoint I/O over a split layout (--tp, --pp; ZeRO on the data group): every rank
// writes its slices and stage of the weights of record and the optimizer state into whole
// tensors, the files one process saves, and reads its own back from any save (train/train_run.h;
// Note [Checkpoints across layouts] in docs/notes/checkpoints.md).
#include <memory>

#include <fmt/format.h>

#include "memfit/io/checkpoint/checkpoint_export.h"
#include "memfit/io/checkpoint/layout_checkpoint.h"
#include "memfit/model/layout_map.h"
#include "memfit/optim/state_runs.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// The run's optimizer over the whole model's layout, unallocated (it keeps a reference to the
// layout, held here beside it): what the save's files and a load check the state against.
struct WholeOptimizer {
  ParamLayout layout;
  std::unique_ptr<Optimizer> opt;
  WholeOptimizer(const OptimConfig& config, const ModelConfig& whole, int64_t steps_taken)
      : layout(whole), opt(make_optimizer(config, layout, nullptr, ElementRange{0, 0})) {
    opt->set_steps_taken(steps_taken);
  }
  WholeOptimizer(const WholeOptimizer&) = delete;
  WholeOptimizer& operator=(const WholeOptimizer&) = delete;
};

}  // namespace

io::LayoutFiles TrainRun::layout_files() const {
  const ModelConfig whole = whole_run_model(mc_);
  const WholeOptimizer w(spec_.optim, whole, off_ ? off_->steps_taken() : opt_->steps_taken());
  // LoRA: no optimizer.safetensors (the adapters' state is adapter_optimizer.safetensors).
  return io::LayoutFiles(whole, record_dtype_, gpt_->lora() ? nullptr : w.opt.get(),
                         settings_.max_shard_bytes);
}

// Every rank (collective over the world): rank 0 lays the files out in the staging directory
// beside the save (cleared of a crashed save's leftovers), a barrier, each rank writes its
// part, a barrier; rank 0's save() then moves them into its atomic save. A rank's part: at ZeRO
// 0 the first data rank's (every data rank holds the same), else its shard; of the tensor
// slices, what no lower tensor rank holds too (the replicated parameters once).
void TrainRun::stage_layout_files() {
  dist::Communicator& world = grid_.world();
  const io::LayoutFiles files = layout_files();
  if (lead_) {
    fs::remove_all(staging_);
    fs::create_directories(staging_);
    files.create(staging_);
  }
  world.barrier();
  // The transposes' staging (GPT-2's Conv1D weights), on every rank as the plan counts it
  // (save_staging_elements).
  Tensor staging;
  if (save_staging_n_ > 0)
    staging =
        Tensor::empty(pool_, {save_staging_n_}, DType::f32, Category::staging, "save.staging");
  // LoRA (Note [LoRA], "Under --tp"): the frozen base's runs, no state; the adapters whole.
  if (gpt_->lora()) gather_adapters();
  // A model's part: the run's, and under --pp-schedule interleaved each chunk's (each a run of
  // the whole layout at its own offset: train_run_chunks.cpp).
  auto write = [&](Transformer& gpt, Optimizer& opt) {
    const ElementRange mine = gpt.lora() ? whole_range(gpt.layout()) : opt.range();
    const std::vector<SliceRun> runs =
        runs_within(first_holder_runs(gpt.config(), grid_.tensor().rank()), mine);
    // LoRA: the frozen base has no optimizer state here (the adapters' is saved whole by
    // gather_adapters' writer).
    io::LayoutFiles::StateParts state;
    if (!gpt.lora()) {
      const WholeOptimizer w(spec_.optim, whole_run_model(gpt.config()), opt.steps_taken());
      state = io::save_state_parts(opt, *w.opt, runs);
    }
    files.write(staging_, runs, gpt.weights().raw_data(), gpt.weights_range().begin, state,
                staging);
  };
  if (my_shard_ || comm_.rank() == 0) {
    // --offload-optimizer: streamed from the files, each chunk's from its own.
    if (off_)
      write_offloaded_part(files, staging, *gpt_, *off_, zero_);
    else
      write(*gpt_, *opt_);
    for (auto& k : chunks_) {
      if (k->off)
        write_offloaded_part(files, staging, *k->gpt, *k->off, k->zero);
      else
        write(*k->gpt, *k->opt);
    }
  }
  staging = Tensor{};
  world.barrier();  // every part is on disk before rank 0 moves the files into the save
}

// --offload-optimizer: this rank's part of `gpt` (under --pp its stage's, under interleaved
// each chunk's: its model, its files in stage-<virtual stage>/) streamed out of its files a
// piece at a time through the optimizer's ring (no byte added: the ring and the save's staging
// are the plan's), the same bytes as from RAM: the weights of record from the master file
// (without master weights the working weights are they: in RAM, or with --offload-params from
// their file), then each state tensor's pieces.
void TrainRun::write_offloaded_part(const io::LayoutFiles& files, const Tensor& staging,
                                    Transformer& gpt, offload::OffloadedOptimizer& off,
                                    ZeroServices& zero) {
  const ElementRange mine = off.range();
  const std::vector<SliceRun> runs =
      runs_within(first_holder_runs(gpt.config(), grid_.tensor().rank()), mine);
  io::LayoutFiles::Writer out(files, staging_, staging);
  if (master_) {
    off.read_master_range(mine, [&](int64_t from, int64_t to, const float* src) {
      out.weights(runs_within(runs, {from, to}), src, from);
    });
  } else if (gpt.params_offloaded()) {
    // --offload-params without master weights: the working weights of record, this rank's
    // part of each unit in unit order (a block's through the model's ring).
    int64_t at = mine.begin;
    const size_t elem = dtype_size(zero.weights->dtype());
    zero.weights->read_mine([&](const char* src, size_t bytes) {
      const int64_t n = static_cast<int64_t>(bytes / elem);
      out.weights(runs_within(runs, {at, at + n}), src, at);
      at += n;
    });
    MEMFIT_CHECK(at == mine.end, "checkpoint", "the working weights' file gave [{}, {}) of [{}, {})",
                 mine.begin, at, mine.begin, mine.end);
  } else {
    out.weights(runs, gpt.weights().raw_data(), gpt.weights_range().begin);
  }
  // Each state tensor's runs (optim/state_runs.h: block-wise state block for block), a piece's
  // cut to its state elements.
  const WholeOptimizer w(spec_.optim, whole_run_model(gpt.config()), off.steps_taken());
  const std::vector<std::vector<SliceRun>> state_runs =
      state_layout_runs(off.descriptor(), *w.opt, runs, StateRunUse::save);
  for (size_t s = 0; s < files.state_count(); ++s)
    off.read_state_to(s, [&](int64_t from, int64_t to, const void* src) {
      out.state(s, runs_within(state_runs[s], {from, to}), src, from);
    });
  out.finish();
}

// This rank's slices and stage of every tensor, from any save (these files, ZeRO's shard files
// of any world size, a Hugging Face directory): the weights of record through the set-up's
// range fill, and when resuming the optimizer state, through the same runs.
void TrainRun::load_by_layout() {
  const ModelConfig whole = whole_run_model(mc_);
  const io::ReadCheckpoint saved{location_.dir, settings_.checkpoint.config};
  const std::unique_ptr<io::ParamSource> source = io::open_checkpoint_weights(saved, whole);
  const std::vector<SliceRun> runs = whole_layout_runs(mc_, grid_.tensor().rank());
  // --offload-optimizer: the master weights written into their file, rounded into the working
  // copy on the way.
  Transformer::MasterSink to_master_file;
  if (off_ && master_)
    to_master_file = [&](const Transformer::RangeFill& fill) { off_->write_master_from(fill); };
  gpt_->set_weights(
      [&](int64_t from, int64_t to, float* dst) {
        fill_from_whole(runs, {from, to}, dst, [&](int64_t a, int64_t b, float* d) {
          source->read_range({a, b}, d);
        });
      },
      piece_, to_master_file);
  if (resume_ && opt_ && !gpt_->lora()) {  // (LoRA's state: load_adapter_state)
    const WholeOptimizer w(spec_.optim, whole, 0);
    io::load_optimizer_state_by_layout(location_.dir, *opt_, *w.opt, runs);
  } else if (resume_ && off_) {  // each piece through the layout map into this rank's files
    const WholeOptimizer w(spec_.optim, whole, 0);
    off_->load_state(
        io::LayoutStateReader(location_.dir, off_->descriptor(), *w.opt, runs, off_->range()));
  }
}

// --pp-schedule interleaved: chunk `k`'s run of every tensor from the save, as load_by_layout
// reads chunk 0's (train_run_chunks.cpp); offloaded master weights and state into the chunk's
// files.
void TrainRun::load_chunk_by_layout(Chunk& k) {
  const ModelConfig whole = whole_run_model(k.run.model);
  const io::ReadCheckpoint saved{location_.dir, settings_.checkpoint.config};
  const std::unique_ptr<io::ParamSource> source = io::open_checkpoint_weights(saved, whole);
  const std::vector<SliceRun> runs = whole_layout_runs(k.run.model, grid_.tensor().rank());
  k.gpt->set_weights(
      [&](int64_t from, int64_t to, float* dst) {
        fill_from_whole(runs, {from, to}, dst, [&](int64_t a, int64_t b, float* d) {
          source->read_range({a, b}, d);
        });
      },
      piece_, k.off && master_ ? Transformer::MasterSink([&](const Transformer::RangeFill& fill) {
        k.off->write_master_from(fill);
      })
                               : Transformer::MasterSink{});
  if (k.gpt->lora()) {  // the adapters and their optimizer's state, as load_or_init's
    if (resume_) {
      load_adapters(location_.dir, *k.gpt);
      load_adapter_state(location_.dir, *k.gpt, *k.opt);
    } else if (!settings_.checkpoint.lora_from.empty()) {
      load_adapters(settings_.checkpoint.lora_from, *k.gpt);
    }
  } else if (resume_ && k.opt) {
    const WholeOptimizer w(k.run.optim, whole, 0);
    io::load_optimizer_state_by_layout(location_.dir, *k.opt, *w.opt, runs);
  } else if (resume_ && k.off) {
    const WholeOptimizer w(k.run.optim, whole, 0);
    k.off->load_state(
        io::LayoutStateReader(location_.dir, k.off->descriptor(), *w.opt, runs, k.off->range()));
  }
}

}  // namespace memfit
