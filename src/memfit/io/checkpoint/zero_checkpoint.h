// ZeRO's sharded checkpoint state: each rank writes its own range of the weights of record and
// its extents of every optimizer state tensor (Optimizer::state_extents) into one file, and rank
// 0 an index naming the world size, every rank's range and extents and the optimizer's state
// specs. Loading reads, for any range (any world size, any stage, the whole layout), the parts of
// the old shards that overlap it, so a checkpoint reshards on load. A stage-0 or one-process
// optimizer.safetensors reads the same way, as one shard over the whole layout.
// See "ZeRO's sharded optimizer state" in docs/notes/checkpoints.md.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/io/checkpoint/checkpoint_export.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/optim/optimizer.h"
#include "memfit/core/element_range.h"
#include "memfit/state/state_placement.h"

namespace memfit::io {

inline constexpr std::string_view kZeroIndexFile = "zero_shards.json";
// The key of a shard's range of the weights of record.
inline constexpr std::string_view kZeroWeightsKey = "weights";

// "zero-rank-00001-of-00004.safetensors" (rank 1 of 4).
std::string zero_shard_file(int rank, int world);

// Rank `rank`'s shard file: `weights` (its range of the weights of record, range() of the
// optimizer's elements) under kZeroWeightsKey and each non-empty state slice under
// optimizer_state_key, each written straight from its tensor (no copy).
void save_zero_shard(const std::filesystem::path& file, const Optimizer& optimizer,
                     const Tensor& weights);

// A shard file's metadata (format, optimizer, steps_taken, begin, end): save_zero_shard's, and
// the offloaded optimizer's streamed shard (offload/offloaded_optimizer.h).
void set_zero_shard_metadata(SafetensorsWriter& writer, const std::string& optimizer,
                             int64_t steps_taken, const ElementRange& range);

// The index's JSON: world size, stage, the optimizer, its steps_taken, the layout's total, the
// whole state specs and, per rank, its file, element range and state extents. Every rank's
// extents are computed here from the placement's shards (the optimizer's state_extents), so
// rank 0 writes it alone. The placement is any rank's (they share the shards and the stage).
std::string zero_index_json(const Optimizer& optimizer, const StatePlacement& placement);

// Whether the checkpoint directory `dir` holds sharded optimizer state (its index).
bool has_zero_shards(const std::filesystem::path& dir);

// Fills `optimizer`'s state (its range, whatever it is) and steps_taken from the checkpoint at
// `dir` (a directory load_checkpoint located): from the shards that overlap its range when the
// index is there, else from optimizer.safetensors (a whole-layout state, cut to the range).
// Everything is checked before a byte is copied (optimizer name, state specs, the layout's size,
// every file and tensor, that the pieces tile the range's extents); an IoError names the file
// and what differs, and the optimizer is then untouched.
void load_optimizer_state_any(const std::filesystem::path& dir, Optimizer& optimizer);

// A saved optimizer state opened for reading one range's part of it, piece by piece: the
// shards that overlap `range` when the index is there, else optimizer.safetensors (a
// whole-layout state). The constructor checks everything load_optimizer_state_any does (and
// throws the same IoError); then read() copies any elements of this range's extents straight
// from the mapped files. What the offloaded optimizer streams into its files with bounded RAM
// (offload/offloaded_optimizer.h), and what load_optimizer_state_any copies into RAM.
class SavedOptimizerState {
 public:
  SavedOptimizerState(const std::filesystem::path& dir, const Optimizer& optimizer,
                      const ElementRange& range);
  ~SavedOptimizerState();
  int64_t steps_taken() const { return steps_; }
  // Whole state tensor `spec`'s elements that `range` holds (Optimizer::state_extents).
  const ElementRange& extent(size_t spec) const { return mine_.at(spec); }
  // Elements `elements` (inside extent(spec), whole-tensor positions) of state tensor `spec`
  // into `dst`, in the state's dtype.
  void read(size_t spec, const ElementRange& elements, void* dst) const;
  // Done with state tensor `spec`: its file pages leave RAM (SafetensorsReader::release).
  void release(size_t spec) const;

 private:
  struct Source {
    ElementRange extent;  // the saved tensor's whole-tensor positions
    const SafetensorsReader* reader;
    const SafetensorsEntry* entry;
    size_t elem_bytes;
  };
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::vector<ElementRange> mine_;
  std::vector<std::vector<Source>> sources_;  // per whole state spec
  int64_t steps_ = 0;
};

// The weights of record from the shard files alone (each one's kZeroWeightsKey range), as a
// ParamSource over make_slab_pieces_source: what export and loads read when a sharded save has
// no model.safetensors. IoError when the index, a file or a range does not fit.
std::unique_ptr<ParamSource> open_zero_weights_source(const std::filesystem::path& dir);
// The same with DIR/config.json as the caller read it (`config`), not read again.
std::unique_ptr<ParamSource> open_zero_weights_source(const std::filesystem::path& dir,
                                                      const ModelConfig& config);

}  // namespace memfit::io
