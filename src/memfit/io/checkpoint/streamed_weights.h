// model.safetensors (or its shards and index) written from weights of record that are not one
// tensor in RAM: offload files read in layout order, a run at a time, each run's bytes written
// straight to their places in the file (positioned writes), GPT-2's Conv1D weights transposed
// on the way through one bounded staging buffer. The same bytes as save_weights of the same
// weights in RAM, in the RAM of the source's own I/O buffers plus that staging. Note [Streamed
// save] in docs/notes/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/io/hf/model_weights.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/core/element_range.h"

namespace memfit::io {

// Layout elements [from, to) of the weights of record, in their element type, at `src`.
using RecordTake = std::function<void(int64_t from, int64_t to, const void* src)>;
// Calls `take` with consecutive runs, in increasing order, that tile `range` (offload files read
// a piece at a time: OffloadedOptimizer::read_master_range, WeightGather::read_range).
using RecordStream = std::function<void(ElementRange range, const RecordTake& take)>;

struct StreamedWeights {
  DType dtype = DType::f32;  // the weights of record's, as they are stored (f32 or bf16)
  RecordStream stream;
  // Where transposed tensors stage their tiles (its bytes; any size of at least one element):
  // needed only where the family stores a tensor transposed (has_transposed_weights).
  Tensor staging;
};

// Whether any parameter of the family is stored transposed (GPT-2's Conv1D weights).
bool has_transposed_weights(const ModelConfig& config, const ParamLayout& layout);

// Writes the weights of record from `record` into the existing directory `dir` as save_weights
// writes them from a slab: the same files, byte for byte. The record is read once per weights
// file (one, or a shard's run of tensors). Returns the names of the files written.
std::vector<std::string> save_weights_streamed(const std::filesystem::path& dir,
                                               const ModelConfig& config,
                                               const ParamLayout& layout,
                                               const StreamedWeights& record,
                                               const WeightsSaveOptions& options = {});

}  // namespace memfit::io
