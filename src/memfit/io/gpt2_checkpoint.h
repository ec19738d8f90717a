// GPT-2 checkpoints: a directory that transformers.GPT2LMHeadModel.from_pretrained(DIR) loads
// (model.safetensors with Hugging Face names and Conv1D layouts, config.json as ModelConfig), plus
// memfit's optimizer state and whatever files the trainer adds, all saved as one atomic unit.
// Loading takes memfit's own saves and Hugging Face GPT-2 directories alike, and refuses a
// checkpoint that does not fit the model before it touches a byte of it.
// Design, file layout and the crash analysis: docs/notes/checkpoints.md.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "memfit/core/tensor.h"
#include "memfit/io/checkpoint_dir.h"
#include "memfit/io/gpt2_hf_config.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"

namespace memfit::io {

inline constexpr std::string_view kModelFile = "model.safetensors";
inline constexpr std::string_view kConfigFile = "config.json";
inline constexpr std::string_view kOptimizerFile = "optimizer.safetensors";

// ---- model.safetensors -----------------------------------------------------------------------

// The Hugging Face name of a parameter: "transformer." + p.name.
std::string gpt2_hf_name(const ParamInfo& p);
// Whether Hugging Face stores the parameter as a Conv1D weight, (in, out): the transpose of
// memfit's (out, in). True for attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights.
bool gpt2_is_conv1d(const ParamInfo& p);

// Writes the slab's parameters as model.safetensors (atomically), in the slab's element type:
// wte without its padding rows, Conv1D weights transposed, no lm_head.weight (tied),
// metadata {"format": "pt"}.
void save_gpt2_weights(const std::filesystem::path& file, const ModelConfig& config,
                       const ParamLayout& layout, const Tensor& slab);
// Reads model.safetensors into the slab (f32 or bf16; stored F32, BF16 or F16 convert).
// Names may carry "transformer." or not; attn.bias / attn.masked_bias buffers are skipped;
// lm_head.weight, if present, must equal wte bit for bit (memfit ties them) or it is refused.
// wte's padding rows are zeroed. Any missing, unexpected, wrongly shaped or unconvertible tensor
// refuses the whole file with an IoError listing the first mismatches; the slab is then
// untouched.
void load_gpt2_weights(const std::filesystem::path& file, const ModelConfig& config,
                       const ParamLayout& layout, Tensor& slab);

// ---- optimizer.safetensors -------------------------------------------------------------------

// Optimizer::state() tensors as "<optimizer>.<state>" ("adamw.m"), bit for bit, with metadata
// {"optimizer": name, "steps_taken": N}.
void save_optimizer_state(const std::filesystem::path& file, Optimizer& optimizer);
// Checks the optimizer name, the tensor names, shapes and dtypes (no conversion: state resumes
// bit-exactly), then copies into the state tensors and restores steps_taken. On any mismatch,
// an IoError listing them, and the optimizer is untouched.
void load_optimizer_state(const std::filesystem::path& file, Optimizer& optimizer);

// ---- GPT-2 checkpoint directories ------------------------------------------------------------

struct CheckpointSaveOptions {
  // Also write optimizer.safetensors from this optimizer's state.
  Optimizer* optimizer = nullptr;
  // More files in the same atomic save: file name (no '/') -> contents, e.g.
  // {"trainer_state.json", json.dump(2)}.
  std::map<std::string, std::string> extra_files;
  // Called with the temporary directory to write any further files into it (binary ones, say).
  // Everything in it is fsynced afterwards, however it was written.
  std::function<void(const std::filesystem::path& temp_dir)> write_extra;
  // Fault injection for tests: see write_directory_atomic (io/checkpoint_dir.h). Also called
  // with SaveStage::model_written once model.safetensors is in the temporary directory.
  std::function<void(SaveStage stage)> on_stage;
};

// Saves a checkpoint directory with write_directory_atomic: DIR afterwards holds either the
// previous checkpoint or the whole new one, whatever fails or crashes. Files: model.safetensors,
// config.json, and optimizer.safetensors and extra files as asked.
void save_gpt2_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                          const ParamLayout& layout, const Tensor& slab,
                          const CheckpointSaveOptions& options = {});

// Loads a checkpoint directory (memfit's or Hugging Face's) found by locate_checkpoint: checks
// config.json against `config`, then model.safetensors, and optimizer.safetensors when an
// optimizer is given; nothing is written into the slab or the optimizer unless all of them fit.
// Extra files (trainer_state.json) are the caller's to read from the returned location's dir.
CheckpointLocation load_gpt2_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                        const ParamLayout& layout, Tensor& slab,
                                        Optimizer* optimizer = nullptr);

}  // namespace memfit::io
