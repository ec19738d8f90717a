// memfit export --hf: a checkpoint consolidated into a Hugging Face directory (model.safetensors,
// or shards above --max-shard-size with model.safetensors.index.json, and config.json; no
// optimizer state or trainer files), GPT-2 or LLaMA names, written one tensor at a time: the
// export holds one parameter (and the writer's bounded staging) whatever the model's size.
//
// What it reads is a ParamSource: a checkpoint's parameters one at a time, whatever its form on
// disk: a directory of Hugging Face safetensors (memfit's own saves, which already are, and
// Hugging Face's), or pieces of the flat parameter slab, one per rank (make_slab_pieces_source:
// a ZeRO-sharded save's shard files, each a rank's range: open_param_source reads a directory
// from them when it has zero_shards.json and no model.safetensors). Note [Export] in
// docs/notes/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>
#include <memory>
#include <optional>

#include "memfit/memory/tensor.h"
#include "memfit/io/checkpoint/sharded_safetensors.h"
#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/core/element_range.h"

namespace memfit::io {

struct ReadCheckpoint;  // model_checkpoint.h

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  // The element type the weights are stored in (f32, or bf16 for a pure-bf16 run's).
  virtual DType dtype() const = 0;
  // Parameter `p` of layout() into `dst` (p's shape, dtype()), vocabulary padding rows zero.
  virtual void read(const ParamInfo& p, const Tensor& dst) = 0;
  // Layout elements [range.begin, range.end) as f32 into dst[0, range.size()): a rank's range
  // of the weights of record (ZeRO) or a piece of it, without any parameter whole in memory.
  // Padding rows and the alignment gaps between parameters are zero.
  void read_range(ElementRange range, float* dst);
  // What it reads, for messages: "checkpoint ck (model.safetensors)".
  virtual std::string describe() const = 0;

 protected:
  // Elements [lo, hi) of parameter `p` (flat, in p's layout shape) as f32 into dst.
  virtual void read_part(const ParamInfo& p, int64_t lo, int64_t hi, float* dst) = 0;
};

// A checkpoint whose ranks each wrote a range of the flat parameter slab (ZeRO's sharded saves):
// piece r holds elements [begin, end) of the slab in memfit's layout (alignment gaps and padding
// rows included), and the pieces, in order, tile [0, layout.total()). `read(from, to, dst)`
// copies the piece's elements [from, to) (slab indices) into dst; how the piece is stored (a
// rank's safetensors file, say) is its own. A parameter is assembled from the pieces it spans.
struct SlabPiece {
  int64_t begin = 0, end = 0;
  std::function<void(int64_t from, int64_t to, void* dst)> read;
};
// ConfigError unless the pieces tile the slab.
std::unique_ptr<ParamSource> make_slab_pieces_source(const ModelConfig& config, DType dtype,
                                                     std::vector<SlabPiece> pieces,
                                                     std::string description);

// The checkpoint directory at `dir` (found by locate_checkpoint) as a source: its config.json,
// and its weights checked against the model before anything is read (IoError naming what does
// not fit).
std::unique_ptr<ParamSource> open_param_source(const std::filesystem::path& dir);

// The weights of the checkpoint at `dir` (found by locate_checkpoint; `where`, if given, gets
// its location) for a model of `config`: config.json checked against it (IoError naming the
// fields that differ), then the weights files checked before anything is read:
// model.safetensors or its shards with the index, else ZeRO's shard files (zero_shards.json;
// a sharded save writes no model.safetensors). What the trainer's --init-from and --resume
// read their ranges from, and load_checkpoint reads a sharded save with.
std::unique_ptr<ParamSource> open_checkpoint_weights(const std::filesystem::path& dir,
                                                     const ModelConfig& config,
                                                     std::filesystem::path* where = nullptr);
// The same, for a checkpoint whose config.json the caller has read (`saved`,
// model_checkpoint.h): checked against `config` with the same errors, not read again.
std::unique_ptr<ParamSource> open_checkpoint_weights(const ReadCheckpoint& saved,
                                                     const ModelConfig& config);

struct ExportOptions {
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  std::optional<DType> dtype;   // store as (f32 or bf16); unset: as the checkpoint stores them
  MemoryPool* pool = nullptr;   // where the one parameter and the staging come from; null: heap
};

// Writes `source` to `out` as a Hugging Face directory, atomically (write_directory_atomic: OUT
// afterwards holds a whole export or what it held before). Returns the files written.
std::vector<std::string> export_hf(const std::filesystem::path& out, ParamSource& source,
                                   const ExportOptions& options = {});

}  // namespace memfit::io
