// A model's weights as Hugging Face stores them: one model.safetensors, or, above a size limit
// (save_pretrained's max_shard_size, "5GB"), shards model-00001-of-0000N.safetensors ... with
// model.safetensors.index.json mapping each tensor to its file:
//   {"metadata": {"total_size": <bytes of all tensors>}, "weight_map": {"<tensor>": "<file>"}}
// The writer streams every tensor from its own memory (io/checkpoint/safetensors.h); the reader
// validates every file's header and the index against the files before anyone reads a tensor.
// See docs/notes/checkpoints.md, "Sharded weights".
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/memory/pool.h"

namespace memfit::io {

inline constexpr std::string_view kModelFile = "model.safetensors";
inline constexpr std::string_view kModelIndexFile = "model.safetensors.index.json";
// transformers' default max_shard_size, "5GB": decimal gigabytes.
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

// A --max-shard-size as transformers reads max_shard_size: "5GB" is 5 * 10^9 bytes, "200MB"
// 2 * 10^8, "2GiB" 2 * 2^30, a bare number bytes. ConfigError (naming `what`) unless positive.
uint64_t parse_max_shard_size(std::string_view text, std::string_view what = "--max-shard-size");

// "model-00002-of-00005.safetensors" for k = 2 (1-based) of n = 5.
std::string shard_file_name(int k, int n);
// The shard (0-based) of each tensor, taken in order: a shard takes tensors while their bytes
// stay within max_shard_bytes; a tensor larger than that gets a shard of its own; a tensor is
// never split.
std::vector<int> plan_shards(const std::vector<uint64_t>& tensor_bytes, uint64_t max_shard_bytes);

// The first few of `mismatches` joined by "; ", then "; and N more": how a load that checks
// everything before it copies lists what it refuses (here, model_weights, model_checkpoint).
std::string join_mismatches(const std::vector<std::string>& mismatches);

struct ShardTensor {
  std::string name;
  Tensor tensor;           // contiguous; stored in its own element type
  bool transpose = false;  // stored as (cols, rows), as SafetensorsWriter::add
  // Instead of `tensor`: one made when its file is written (SafetensorsWriter::add_deferred),
  // of `shape` and `dtype`, stored as `store_as` (its own type when unset).
  std::function<Tensor()> produce;
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::optional<DType> store_as;
  // Instead of `tensor`: bytes of `shape` (as stored) and `dtype` that the scatter pass writes
  // (ShardedWriteOptions::scatter; SafetensorsWriter::add_scattered).
  bool scattered = false;
};

struct ShardedWriteOptions {
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  MemoryPool* staging_pool = nullptr;            // SafetensorsWriter::set_staging_pool
  std::map<std::string, std::string> metadata;  // every file's __metadata__
  // The scattered tensors' bytes: called once per file with the tensors it holds, [first,
  // last) of `tensors` (a file holds a run of them), and a sink taking a tensor's index in
  // `tensors`, a byte offset in it and the bytes (SafetensorsWriter::set_scatter).
  using ScatterSink =
      std::function<void(size_t tensor, uint64_t offset, const void* data, size_t bytes)>;
  std::function<void(size_t first, size_t last, const ScatterSink& sink)> scatter;
};

// Writes `tensors`, in their order, into the existing directory `dir`: model.safetensors if
// their bytes are at most max_shard_bytes, else the shards and the index. Each file is written
// atomically (a whole directory is made atomic by write_directory_atomic around this). Returns
// the names of the files written.
std::vector<std::string> write_model_safetensors(const std::filesystem::path& dir,
                                                 const std::vector<ShardTensor>& tensors,
                                                 const ShardedWriteOptions& options = {});

// One tensor of a model's safetensors, and the file holding it.
struct StoredTensor {
  const SafetensorsReader* file;
  const SafetensorsEntry* entry;
};

// A model's safetensors, one file or sharded, validated and memory-mapped (no tensor read yet).
class ModelSafetensors {
 public:
  // `path`: a directory holding model.safetensors (preferred, as transformers does) or
  // model.safetensors.index.json; a .safetensors file; or an index file. For an index: every
  // file it names must exist and be valid, every tensor it lists must be in the file it names,
  // and every tensor of those files must be listed there, exactly once. Anything else is an
  // IoError naming the index, the file and the tensor (the first few mismatches and a count).
  explicit ModelSafetensors(const std::filesystem::path& path);

  // The file errors name: model.safetensors or the index.
  const std::filesystem::path& source() const { return source_; }
  bool sharded() const { return sharded_; }
  // Every tensor of every file: files in name order, each file's tensors in data order.
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  const StoredTensor* find(std::string_view name) const;  // nullptr if absent
  // " in model-00002-of-00003.safetensors" for a sharded model's tensor, else "".
  std::string where(const StoredTensor& t) const;

 private:
  void open_index(const std::filesystem::path& index);

  std::filesystem::path source_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
};

}  // namespace memfit::io
