// Checkpoints of any family memfit builds: a directory that transformers' from_pretrained(DIR)
// loads (GPT2LMHeadModel or LlamaForCausalLM: weights as model.safetensors or shards with an
// index, config.json as the family's config), plus memfit's optimizer state and whatever files
// the trainer adds, all saved as one atomic unit. Loading takes memfit's own saves and Hugging
// Face directories alike, and refuses a checkpoint that does not fit the model before it
// touches a byte of the slab or the optimizer. Names and layouts: io/hf/model_weights.h.
// Design, file layout and the crash analysis: docs/notes/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

#include "memfit/memory/tensor.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/hf/model_hf_config.h"
#include "memfit/io/hf/model_weights.h"
#include "memfit/io/checkpoint/sharded_safetensors.h"
#include "memfit/io/checkpoint/streamed_weights.h"
#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"

namespace memfit::io {

inline constexpr std::string_view kConfigFile = "config.json";
inline constexpr std::string_view kOptimizerFile = "optimizer.safetensors";

// ---- optimizer.safetensors -------------------------------------------------------------------

// The key of an optimizer's state tensor in optimizer.safetensors: "<optimizer>.<state>"
// ("adamw.m"), or the state's name where it already starts with the optimizer's.
std::string optimizer_state_key(const std::string& optimizer, const std::string& state);

// Optimizer::state() tensors as "<optimizer>.<state>" ("adamw.m"), bit for bit, with metadata
// {"optimizer": name, "steps_taken": N}, each written straight from its tensor.
void save_optimizer_state(const std::filesystem::path& file, Optimizer& optimizer);
// Checks the optimizer name, the tensor names, shapes and dtypes (no conversion: state resumes
// bit-exactly), then copies into the state tensors and restores steps_taken. On any mismatch,
// an IoError listing them, and the optimizer is untouched.
void load_optimizer_state(const std::filesystem::path& file, Optimizer& optimizer);

// ---- checkpoint directories ------------------------------------------------------------------

struct CheckpointSaveOptions {
  // Also write optimizer.safetensors from this optimizer's state.
  Optimizer* optimizer = nullptr;
  // More files in the same atomic save: file name (no '/') -> contents, e.g.
  // {"trainer_state.json", json.dump(2)}.
  std::map<std::string, std::string> extra_files;
  // Called with the temporary directory to write any further files into it (binary ones, say).
  // Everything in it is fsynced afterwards, however it was written.
  std::function<void(const std::filesystem::path& temp_dir)> write_extra;
  // Fault injection for tests: see write_directory_atomic (io/checkpoint/checkpoint_dir.h). Also
  // called with SaveStage::model_written once the weights (every shard and the index) are written.
  std::function<void(SaveStage stage)> on_stage;
  // Weights larger than this are sharded (transformers' max_shard_size; "5GB" by default).
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Staging for GPT-2's Conv1D transposes comes from here (Category::staging); null: the heap.
  MemoryPool* staging_pool = nullptr;
  // A ZeRO-sharded save (save_checkpoint given no slab): the weights are in the shard files
  // write_extra adds, in this type (config.json's torch_dtype), and no model.safetensors is
  // written (docs/notes/checkpoints.md, "ZeRO's sharded optimizer state").
  std::optional<DType> sharded_weights_dtype;
  // Weights of record that are not one tensor in RAM (offloaded, one process): save_checkpoint
  // given no slab writes model.safetensors from this stream, the same bytes
  // (save_weights_streamed; Note [Streamed save] in docs/notes/checkpoints.md).
  std::optional<StreamedWeights> streamed_weights;
};

// Saves a checkpoint directory with write_directory_atomic: DIR afterwards holds either the
// previous checkpoint or the whole new one, whatever fails or crashes. Files: model.safetensors
// (or model-0000K-of-0000N.safetensors and model.safetensors.index.json), config.json (the
// family's, torch_dtype the slab's type), and optimizer.safetensors and extra files as asked.
// An undefined `slab`: the weights streamed (options.streamed_weights), or no weights files
// (options.sharded_weights_dtype says their type).
void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                     const ParamLayout& layout, const Tensor& slab,
                     const CheckpointSaveOptions& options = {});

// What differs between a checkpoint's model (`saved`) and `c`, one text a field in the family's
// config.json names ("n_layer is 2 there, 6 here"); empty when they are the same model.
std::vector<std::string> config_differences(const ModelConfig& saved, const ModelConfig& c);

// IoError unless save_checkpoint could write DIR (checkpoint_dir.h, check_directory_writable):
// checked before a run's first step, so that a run cannot train only to fail at its save.
void check_checkpoint_writable(const std::filesystem::path& dir);

// IoError naming the fields unless DIR/config.json (DIR as located) is a model of `config`.
void check_checkpoint_config(const std::filesystem::path& dir, const ModelConfig& config);

// A checkpoint located (locate_checkpoint) and its config.json read, by a caller that reads it
// once: a resumed run has it from its resolution (train/train_spec.h, RunCheckpoint) and hands
// it to load_checkpoint and open_checkpoint_weights, which then check the model against it
// instead of reading config.json again.
struct ReadCheckpoint {
  std::filesystem::path dir;  // as located
  ModelConfig config;         // dir/config.json, as read
};
// locate_checkpoint(dir) and its config.json read (IoError as read_model_config's).
ReadCheckpoint read_checkpoint(const std::filesystem::path& dir);
// check_checkpoint_config against the config.json as read, not read again.
void check_checkpoint_config(const ReadCheckpoint& saved, const ModelConfig& config);
// What to tell about a directory without safetensors weights ("" or a pointer to
// pytorch_model.bin).
std::string no_weights_hint(const std::filesystem::path& dir);

// Whether DIR holds Hugging Face weights files (model.safetensors, or the index of shards);
// a ZeRO-sharded save holds only its shard files.
bool has_model_weights(const std::filesystem::path& dir);

// The config.json of the checkpoint at DIR (found by locate_checkpoint), any family.
ModelConfig read_checkpoint_config(const std::filesystem::path& dir);

// Loads a checkpoint directory (memfit's or Hugging Face's) found by locate_checkpoint: checks
// config.json against `config` (family and every field that shapes the model), then the weights
// (one file or sharded, or a ZeRO-sharded save's shard files: then without optimizer), and
// optimizer.safetensors when an optimizer is given; nothing is written into the slab or the
// optimizer unless all of them fit. Extra files (trainer_state.json) are
// the caller's to read from the returned location's dir.
CheckpointLocation load_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                   const ParamLayout& layout, Tensor& slab,
                                   Optimizer* optimizer = nullptr);
// The same, for a checkpoint whose config.json the caller has read (`saved`): checked against
// `config` as above, with the same errors, without reading the file again.
void load_checkpoint(const ReadCheckpoint& saved, const ModelConfig& config,
                     const ParamLayout& layout, Tensor& slab, Optimizer* optimizer = nullptr);

}  // namespace memfit::io
