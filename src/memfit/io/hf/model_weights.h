// A model's weights under Hugging Face's names and layouts, for every family memfit builds, so
// transformers' GPT2LMHeadModel / LlamaForCausalLM load memfit's saves and memfit loads theirs:
//   GPT-2: "transformer." + ParamLayout's name; attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
//          weights stored as Conv1D [in, out] (transposed); no lm_head.weight (tied to wte).
//   LLaMA: ParamLayout's names as they are (they are Hugging Face's), every weight as
//          torch.nn.Linear [out, in], no transposes; lm_head.weight only when untied.
// The token embedding and an untied head are stored without memfit's vocabulary padding rows.
// Saving streams each tensor from the slab (through at most one tensor-sized staging buffer);
// loading validates every file first and then reads each tensor straight into its slab view.
// See docs/notes/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/io/checkpoint/sharded_safetensors.h"
#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit::io {

// Hugging Face's name of a parameter.
std::string hf_param_name(const ModelConfig& config, const ParamInfo& p);
// Whether Hugging Face stores the parameter transposed (GPT-2's Conv1D weights).
bool hf_param_transposed(const ModelConfig& config, const ParamInfo& p);
// The shape Hugging Face stores: padding rows dropped, Conv1D weights transposed.
std::vector<int64_t> hf_param_shape(const ModelConfig& config, const ParamInfo& p);
// The part of a slab's parameter that is stored: its view without vocabulary padding rows.
Tensor hf_param_view(const ModelConfig& config, const ParamLayout& layout, const Tensor& slab,
                     const ParamInfo& p);

// GPT-2's rules alone: "transformer." + p.name; true for the four Conv1D weights.
std::string gpt2_hf_name(const ParamInfo& p);
bool gpt2_is_conv1d(const ParamInfo& p);

struct WeightsSaveOptions {
  // Above this many bytes of tensors, shards and an index (io/checkpoint/sharded_safetensors.h).
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Where conversion / transpose staging comes from (Category::staging); null: the heap.
  MemoryPool* staging_pool = nullptr;
};

// Writes the slab's parameters, in the slab's element type and layout order, into the existing
// directory `dir`: model.safetensors, or shards and model.safetensors.index.json when larger
// than max_shard_bytes; metadata {"format": "pt"}. Returns the names of the files written.
std::vector<std::string> save_weights(const std::filesystem::path& dir, const ModelConfig& config,
                                      const ParamLayout& layout, const Tensor& slab,
                                      const WeightsSaveOptions& options = {});
// The most staging save_weights takes at once for a slab of `record` elements (GPT-2's
// transposed Conv1D weights; 0 where every tensor goes out as it is, as LLaMA's do): what a
// run that saves from RAM adds to its peak (plan/memory_plan.cpp counts it).
size_t save_weights_staging_bytes(const ModelConfig& config, const ParamLayout& layout,
                                  DType record);
// The same as one safetensors file at `file`, whatever its size.
void save_weights_file(const std::filesystem::path& file, const ModelConfig& config,
                       const ParamLayout& layout, const Tensor& slab,
                       MemoryPool* staging_pool = nullptr);

// A load that has been checked and not yet done: constructing it opens the files (a .safetensors
// file, an index, or a directory holding either; see ModelSafetensors), matches every tensor to
// the layout and throws IoError listing the first mismatches (missing, unexpected, wrong shape,
// a type that cannot load into the slab, a tied head that differs from the embedding); the slab
// is untouched. apply() then streams every tensor into its slab view (F32/BF16/F16 stored
// convert into an f32 or bf16 slab) and zeroes the padding rows.
// Accepted extras: GPT-2 names with or without "transformer.", its attn.bias / attn.masked_bias
// buffers and LLaMA's rotary_emb.inv_freq buffers (skipped), and an lm_head.weight in a tied
// model's file if it equals the embedding bit for bit.
class WeightsLoad {
 public:
  WeightsLoad(const std::filesystem::path& path, const ModelConfig& config,
              const ParamLayout& layout, const Tensor& slab);
  // The checks alone, for a slab of `dtype` that is not there: read() then streams one parameter
  // at a time (memfit export).
  WeightsLoad(const std::filesystem::path& path, const ModelConfig& config,
              const ParamLayout& layout, DType dtype);
  void apply();
  // Parameter `p` into `dst` (p's shape in the layout, the checked dtype): the stored tensor,
  // transposed back where Hugging Face stores it transposed, padding rows zeroed.
  void read(const ParamInfo& p, const Tensor& dst) const;
  // Elements [lo, hi) of parameter `p` (flat indices into p's layout shape, padding rows
  // included: zero) into dst[0, hi - lo) as f32, read from the mapped file element by element
  // (transposed back, F32/BF16/F16 widened exactly): a rank's part of a tensor without the
  // tensor in memory.
  void read_part(const ParamInfo& p, int64_t lo, int64_t hi, float* dst) const;
  const ModelSafetensors& files() const { return files_; }
  // The stored element type of parameter `p`.
  SafetensorsDType stored_dtype(const ParamInfo& p) const;

 private:
  struct Copy {
    const StoredTensor* from;
    Tensor to;
    bool transpose;
  };
  void check(const ModelConfig& config, const ParamLayout& layout, DType dtype);

  ModelConfig config_;
  ModelSafetensors files_;
  std::map<std::string, const StoredTensor*> found_;  // layout name -> stored tensor
  std::vector<Copy> copies_;
  std::vector<Tensor> padding_;  // rows to zero after the copies
};

// WeightsLoad(path, ...).apply().
void load_weights(const std::filesystem::path& path, const ModelConfig& config,
                  const ParamLayout& layout, Tensor& slab);

}  // namespace memfit::io
