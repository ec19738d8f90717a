// One training run, as train() runs it: the objects a run holds (the pool, where its state lives,
// the model, the optimizer, the data, the log) and what it does with them, split by concern so
// each part reads alone: set-up (train_run_setup.cpp), checkpoint loading and saving
// (train_run_checkpoint.cpp; over a tp x pp layout train_run_layout.cpp), the step and the
// evaluation (train_run_step.cpp), the log and the profile (train_run_log.cpp), and the loop
// (trainer.cpp). Internal to train/: callers use
// train() (train/trainer.h). Members are declared in the order they are made, so they go in the
// reverse order (the model before the files it reads, the files before their directories, the
// pool last).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/core/scoped_threads.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/dist/grad_sync.h"
#include "memfit/dist/pipeline_runner.h"
#include "memfit/dist/process_grid.h"
#include "memfit/dist/tied_gradient.h"
#include "memfit/dist/zero/zero_state.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/checkpoint/layout_checkpoint.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/created_directories.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/memory/pool.h"
#include "memfit/model/transformer.h"
#include "memfit/offload/offloaded_grads.h"
#include "memfit/offload/offloaded_optimizer.h"
#include "memfit/offload/param_file.h"
#include "memfit/optim/backward_update.h"
#include "memfit/profile/leak_check.h"
#include "memfit/profile/profiler.h"
#include "memfit/state/state_placement.h"
#include "memfit/train/interrupt.h"
#include "memfit/train/loss_scaler.h"
#include "memfit/train/masked_loss.h"
#include "memfit/train/progress.h"
#include "memfit/train/resume_state.h"
#include "memfit/train/train_spec.h"
#include "memfit/train/trainer.h"
#include "memfit/train/update.h"

namespace memfit {

class TrainRun {
 public:
  // The set-up, in order: the pool and the profiler, where the state lives and the objects
  // that hold it, the weights (initialised, or loaded from the checkpoint with the optimizer
  // state and the trainer state), the step's reservation, the data and the log. `spec` is
  // the run as resolved and agreed by every rank (train()).
  TrainRun(dist::ProcessGrid& grid, const TrainSpec& spec);
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  // The steps, the final save, and the summary (trainer.cpp).
  TrainSummary run();

 private:
  // Where the offload files' counters stood when a step began (the log's per-step I/O).
  struct IoMark {
    offload::IoStats optimizer, grads;
    offload::ParamIoStats params;
    uint64_t grads_backward = 0;
  };
  // What a step did, for the log, the progress line and the summary (train_run_step.cpp).
  struct StepResult {
    float loss = 0, lr = 0, loss_scale = 1;
    UpdateOutcome update;
    int64_t update_gathered = 0;  // the offloaded update's all-gather (ZeRO)
    double seconds = 0, rate = 0;
    IoMark before;  // the offload files' counters as the step began
    // --tp: what the tensor group's collectives covered in this step (its forward, backward
    // and update; not an evaluation's).
    dist::CommunicatorTensorGroup::Volume tensor_comm;
  };

  // Set-up (train_run_setup.cpp).
  void start_profiler();
  void make_state_files();
  void make_backward_update();
  void make_model();
  void say_fp8_storage() const;
  void create_optimizer();
  void check_disk_limit() const;
  void make_grad_widen();
  void prepare_step();
  void open_data();
  void open_log();

  // Checkpoints (train_run_checkpoint.cpp).
  void load_or_init();
  void load_weights();
  void load_by_layout();
  // LoRA's adapters and their optimizer state, whole in the files, this rank's slices under
  // --tp (train_run_lora.cpp; Note [LoRA], "Under --tp").
  void load_adapters(const std::filesystem::path& dir);
  void load_adapters(const std::filesystem::path& dir, Transformer& gpt);
  void load_adapter_state(const std::filesystem::path& dir);
  void load_adapter_state(const std::filesystem::path& dir, Transformer& gpt, Optimizer& opt);
  void gather_adapters();
  void save_adapters(const std::filesystem::path& dir);
  void load_offloaded_state();
  void load_trainer_state();
  Tensor record_for_save();
  void stage_shards();
  void stage_layout_files();
  void write_offloaded_part(const io::LayoutFiles& files, const Tensor& staging,
                            Transformer& gpt, offload::OffloadedOptimizer& off,
                            ZeroServices& zero);
  io::LayoutFiles layout_files() const;
  void save(int64_t step, const Tensor& record);
  io::StreamedWeights streamed_weights(Tensor& save_staging);
  void save_if_due(int64_t step, bool last);

  // --pp-schedule interleaved (train_run_chunks.cpp; Note [Pipeline parallel], "Interleaved"):
  // this rank's chunks after its first, each a model of its virtual stage with its own
  // optimizer, placement and gradient exchange, and the step, update and evaluation over all.
  // Offloaded (Note [NVMe offload], "Under --pp"), its files in a directory of its own,
  // stage-<virtual stage>/ under the data rank's, made before the model (the working weights'
  // file) and after it (the optimizer's), so they go in the reverse order, as the run's do.
  struct Chunk {
    RunSpec run;  // RunSpec::stage(virtual stage)
    std::optional<StatePlacement> placement;
    std::filesystem::path offload_dir;
    io::CreatedDirectories offload_dirs;
    std::unique_ptr<offload::ParamFile> param_file;  // --offload-params nvme
    ZeroServices zero;
    std::optional<Transformer> gpt;
    std::unique_ptr<Optimizer> opt;                     // in RAM, or
    std::unique_ptr<offload::OffloadedOptimizer> off;  // --offload-optimizer nvme
    std::optional<dist::GradientSync> sync;
    std::optional<RankShards> shards;
  };
  void make_optimizer_for(Transformer& gpt, const OptimConfig& optim,
                          const std::filesystem::path& dir, std::optional<ElementRange> shard,
                          std::unique_ptr<Optimizer>& opt,
                          std::unique_ptr<offload::OffloadedOptimizer>& off);
  void place_optimizer(Optimizer& opt, Transformer& gpt);
  void make_chunks();
  void make_chunk_files(Chunk& k, int virtual_stage);
  void make_chunk_optimizer(Chunk& k);
  int64_t offloaded_chunk_step(Transformer& gpt, offload::OffloadedOptimizer& off,
                               ZeroServices& zero, const StatePlacement& placement,
                               const RankShards* shards, float rate, float scale);
  int64_t chunks_widen_elements() const;
  void load_chunk_by_layout(Chunk& k);
  void prepare_chunks();
  Transformer& chunk_model(int c);
  std::optional<dist::GradientSync>& chunk_sync(int c);
  double chunk_micro_batches(const StepLoss& step_loss);
  UpdateOutcome chunk_update(float lr);
  double chunk_evaluate(const StepLoss& eval_loss, int64_t n);
  Transformer& tied_model();
  const StatePlacement& tied_placement() const;

  // The step (train_run_step.cpp).
  StepResult step(int64_t step, std::chrono::steady_clock::time_point t0);
  double micro_batches(int64_t step, const StepLoss& step_loss);
  double pipeline_micro_batches(const StepLoss& step_loss);
  void pipeline_pass(const StepLoss& step_loss, std::vector<float>& losses);
  double from_last_stage(double x);
  UpdateOutcome update(float lr, float loss, float loss_scale, int64_t& update_gathered);
  void offloaded_step(float rate, float scale, int64_t& update_gathered);
  void offload_io_waits();
  void check_finite(int64_t step, const StepResult& r);
  float evaluate();
  bool stop_requested();
  float sum_ranks(float x);
  Tensor my_part(Tensor& slab) const;

  // The log and the profile (train_run_log.cpp).
  void log_line(const nlohmann::json& j);
  void run_step(int64_t step);
  void log_step(int64_t step, const StepResult& r);
  nlohmann::json offload_line(const IoMark& before);
  IoMark io_mark() const;
  offload::IoStats optimizer_io() const;  // every chunk's offloaded optimizer's (io_mark)
  offload::ParamIoStats params_io() const;  // every chunk's working weights' file's
  CategoryBytes offload_files() const;
  std::string progress_text(const StepResult& r) const;
  void log_rank_peaks();
  nlohmann::json run_state_json() const;
  nlohmann::json trainer_state_json(int64_t step) const;
  void params_io_waits();
  profile::StepRecorder* recorder() const { return profiler_ ? profiler_->recorder() : nullptr; }
  void finish_summary();

  // The ranks: gradients, the loss and the evaluation are summed over the data group (`comm_`,
  // W_ ranks); the world's rank 0 (`lead_`) alone logs, shows progress and saves.
  dist::ProcessGrid& grid_;
  dist::Communicator& comm_;
  // --tp: the ranks this rank's layers are split with (Note [Tensor parallel]); the model's step
  // issues its collectives on it.
  dist::CommunicatorTensorGroup tensor_;
  // --pp: the ranks of this rank's pipeline (rank = stage; Note [Pipeline parallel]). `settings_`
  // below is this rank's stage's run (RunSpec::stage): its model holds the stage's parameters.
  dist::Communicator& pipe_;
  const int W_;
  const bool lead_;
  // The run, resolved: `spec_` as the planner planned it (the model, shapes, precision, policy,
  // budget), `settings_` the whole (the loop's settings too); `location_` the checkpoint it
  // starts from (dir empty without).
  const TrainSpec settings_;
  const RunSpec& spec_;
  const io::CheckpointLocation& location_;
  const bool resume_;
  const ModelConfig& mc_;
  const int T_, B_;

  const ScopedThreads run_threads_;  // --threads for this run only
  const std::chrono::steady_clock::time_point wall_start_;
  MemoryPool pool_;
  // The collectives' buffers are this run's pool's (Category::comm), until it ends; the tensor
  // group's (lent in make_model) go back before the pool does.
  struct PoolRelease {
    dist::Communicator& comm;
    dist::CommunicatorTensorGroup& tensor;
    ~PoolRelease() {
      comm.set_pool(nullptr);
      tensor.release_buffers();
    }
  } pool_release_;
  std::unique_ptr<profile::Profiler> profiler_;  // --profile
  // The leak check: the pool's live bytes by tag at every step boundary (profile/leak_check.h).
  profile::LeakCheck leaks_;
  std::vector<Allocation> test_leaks_;  // settings_.test_leak_bytes: the tests' deliberate leak

  // Where this rank's state lives (Note [State placement]); nothing else decodes the stage.
  const StatePlacement placement_;
  const std::optional<ElementRange> my_shard_;
  const bool offload_;  // the optimizer state (and master weights) in files
  const bool master_;   // the precision keeps master weights
  const std::filesystem::path offload_dir_;
  io::CreatedDirectories offload_dirs_;
  std::string offload_run_;
  std::unique_ptr<offload::ParamFile> param_file_;  // --offload-params nvme
  std::unique_ptr<GradStore> grad_store_;           // --offload-grads nvme, until the model has it
  offload::OffloadedGrads* grads_file_ = nullptr;
  // --update-in-backward (Note [Update in backward]): the per-unit steps, owned here at stages
  // 2-3 (the model's UnitGrads calls them) or by the one-process store; attached to the
  // optimizer once it exists.
  std::unique_ptr<UnitSteps> rank_steps_;
  UnitSteps* fused_ = nullptr;
  ZeroServices zero_;
  std::optional<Transformer> gpt_;
  std::unique_ptr<DynamicLossScaler> scaler_;  // fp16
  std::unique_ptr<Optimizer> opt_;             // the optimizer in RAM, or
  // LoRA at stage 3: the frozen base's shard saved as a ZeRO shard file with no state (a
  // stateless optimizer over this rank's range names it in the index; Note [LoRA]).
  std::unique_ptr<Optimizer> base_record_;
  std::unique_ptr<offload::OffloadedOptimizer> off_;  // the one streamed from files
  ElementRange my_range_;  // this rank's range of the layout (the whole layout without ZeRO)
  int64_t piece_ = 0;      // the set-up's staging piece (setup_piece_elements)

  int64_t start_step_ = 0, data_position_ = 0;
  ResumeState resumed_;  // the checkpoint's trainer_state.json, when resuming
  std::filesystem::path state_file_;

  std::optional<dist::GradientSync> sync_;  // stages 0-1 over several ranks: the slab's exchange
  std::optional<RankShards> rank_shards_;   // how the update sees the ranks (W > 1)
  // --pp: the step's micro-batches through this stage, and the evaluation's forwards.
  std::unique_ptr<dist::PipelineRunner> runner_;
  // --pp with tied embeddings, the first and last stages: the table's gradient summed between
  // them after the backward (dist/tied_gradient.h).
  std::optional<dist::TiedGradient> tied_;
  // bf16 gradients: the update's widening buffer, every chunk's (make_grad_widen).
  Tensor grad_widen_;
  // --pp-schedule interleaved: chunks 1 .. V - 1 of this rank (chunk 0 is gpt_, opt_, sync_).
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::unique_ptr<io::DataLoader> train_data_, val_data_;
  int64_t last_step_ = 0;

  TrainSummary summary_;
  std::string data_tokenizer_;  // the data's dataset.json's tokenizer, for trainer_state.json
  std::ofstream log_;           // --log, rank 0

  // Saves: the weights of record streamed from their files (save_streams_weights), or ZeRO's
  // shard files staged beside the save (sharded_state).
  bool streamed_save_ = false;
  int64_t save_staging_n_ = 0;
  // A quantized base: the save's dequantization staging (save_quant_staging_elements), held
  // while saving.
  int64_t save_quant_n_ = 0;
  Tensor save_quant_staging_;
  DType record_dtype_ = DType::f32;
  bool sharded_state_ = false;
  // --tp or --pp (layout_split): every rank writes its runs of the weights of record and of the
  // optimizer state straight into whole tensors staged beside the save, which rank 0's atomic
  // save moves in (stage_layout_files; Note [Checkpoints across layouts]).
  bool layout_save_ = false;
  std::filesystem::path staging_;
  // LoRA under --tp: the whole adapters and their optimizer's state, gathered over the tensor
  // group for a save (gather_adapters), in a pool of their own (a save's, not the step's).
  std::unique_ptr<MemoryPool> adapter_heap_;
  std::optional<LoraLayout> whole_lora_;
  Tensor whole_adapters_;
  std::unique_ptr<Optimizer> whole_adapter_opt_;

  // The loop.
  std::optional<Progress> progress_;
  std::optional<InterruptScope> interrupts_;  // SIGINT/SIGTERM: stop after this step, then save
  std::chrono::steady_clock::time_point last_save_;
  std::vector<double> rates_;
  double tokens_per_step_ = 0;  // every rank's
  int64_t saved_at_ = -1;
  uint64_t last_step_io_ = 0;  // offload: the last step's bytes read and written (this rank)
};

// This rank's offload directory under its data rank's `dir`: `stage-<s>/` under --pp (s: the
// stage, or the chunk's virtual stage under --pp-schedule interleaved), then `tensor-<t>/`
// under --tp (train_run_setup.cpp).
std::filesystem::path grid_offload_dir(std::filesystem::path dir, int stage,
                                       const dist::ProcessGrid& grid);

// Helpers of the log and the profile (train_run_log.cpp).
nlohmann::json memory_json(const CategoryBytes& bytes);
// The run as the profile's summary and page describe it.
nlohmann::json run_json(const TrainSpec& spec, const StatePlacement& placement);
// Nats per token of the training data's unigram distribution.
double unigram_entropy(io::DataLoader& loader, int vocab);
// Keeps the JSON lines of `file` whose "step" is at most `step` (and drops a torn last line),
// rewriting it atomically; a missing file stays missing.
void truncate_log_after(const std::string& file, int64_t step);

}  // namespace memfit
