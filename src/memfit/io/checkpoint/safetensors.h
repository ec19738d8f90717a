// Hugging Face's safetensors format, read and written exactly as documented, so memfit's
// checkpoints load in transformers and Hugging Face checkpoints load in memfit:
//   [u64 little-endian N][N bytes of UTF-8 JSON header, space-padded][data section]
//   header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value"}}   (optional; string values only)
// Offsets are relative to the data section, which tensors cover with no holes or overlaps.
// The reader checks all of that before anyone touches a byte, and says which file, which tensor
// and what was expected when a file is wrong. See docs/notes/checkpoints.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"

namespace memfit::io {

// The element types the format names. Sub-byte types (F4, F6_*) are not supported.
enum class SafetensorsDType : uint8_t {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  C64
};

size_t safetensors_dtype_size(SafetensorsDType dtype);
std::string_view safetensors_dtype_name(SafetensorsDType dtype);  // "F32"
std::optional<SafetensorsDType> safetensors_dtype_parse(std::string_view name);
// memfit's element type stored as: f32 -> F32, bf16 -> BF16, f16 -> F16, i8 -> I8, i32 -> I32,
// u16 -> U16.
SafetensorsDType safetensors_dtype_of(DType dtype);
// The memfit element type of a stored one, if memfit has it.
std::optional<DType> memfit_dtype_of(SafetensorsDType dtype);

// "(2, 3)" for error messages, as Shape prints.
std::string format_shape(const std::vector<int64_t>& shape);

// One tensor of a safetensors file, as its header describes it.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDType dtype;
  std::vector<int64_t> shape;   // any rank; [] is a scalar (one element)
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// Collects tensors and metadata, then writes one file atomically (io/atomic_file.h).
// Tensors are laid out by element size, largest first, then by name: the order Hugging Face's
// writer uses, which keeps every tensor aligned to its element size (the header is padded to a
// multiple of 8), and an order that does not depend on the order of add() calls.
class SafetensorsWriter {
 public:
  // The staging write() takes for a tensor of `rows` x `cols` stored as `to` from `from`
  // (transposed or not): 0 where its bytes go out as they are, else a band of at most 4 MiB
  // (one transposed row band if larger), at most the tensor. The planner counts a save's
  // staging with it (save_weights_staging_bytes).
  static size_t staging_bytes(SafetensorsDType from, SafetensorsDType to, int64_t rows,
                              int64_t cols, bool transpose);

  // Stores `tensor` (contiguous; its storage is kept alive until write()) under `name`.
  // `store_as` converts on the way out (f32 <-> bf16, or the same type); `transpose` stores a
  // 2-D (rows, cols) tensor as (cols, rows), as Hugging Face's Conv1D weights are.
  void add(std::string name, const Tensor& tensor, std::optional<DType> store_as = std::nullopt,
           bool transpose = false);
  // Stores raw bytes (any format dtype); `data` must stay valid until write().
  void add_raw(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape,
               const void* data);
  // Stores bytes that `source` produces when the file is written, in order, by calling its
  // argument with each piece (in all exactly the tensor's bytes): a tensor streamed from
  // somewhere that is not in memory (an offload file, a unit at a time).
  using ByteSink = std::function<void(const void* data, size_t bytes)>;
  void add_source(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape,
                  std::function<void(const ByteSink& sink)> source);
  // Stores a tensor that does not exist yet: write() calls `produce`, which returns it
  // (contiguous, of `shape` and `dtype` as declared, before any transpose), writes it and lets go
  // of it before producing the next, so a file of many tensors costs one tensor's memory at a
  // time (memfit export reads each from a checkpoint this way).
  void add_deferred(std::string name, std::vector<int64_t> shape, DType dtype,
                    std::function<Tensor()> produce, std::optional<DType> store_as = std::nullopt,
                    bool transpose = false);
  // Stores a tensor whose bytes are written in any order, at positions of the caller's choosing,
  // by the scatter pass (set_scatter): the weights of record streamed from offload files in
  // layout order, GPT-2's Conv1D weights transposed on the way (Note [Streamed save] in
  // docs/notes/checkpoints.md). Returns the id the scatter sink takes.
  size_t add_scattered(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape);
  // write() calls `fill` once, after every other tensor's bytes, with a sink that writes
  // `bytes` at byte `offset` of scattered tensor `id` (positioned writes: nothing is buffered).
  // Each scattered tensor must get exactly its bytes, each write inside it; else write()
  // throws (and the file is not created).
  using ScatterSink =
      std::function<void(size_t id, uint64_t offset, const void* data, size_t bytes)>;
  void set_scatter(std::function<void(const ScatterSink& sink)> fill) {
    scatter_ = std::move(fill);
  }
  void set_metadata(const std::string& key, const std::string& value);
  // Where conversions and transposes stage their bytes: one buffer at a time, of at most one
  // tensor's stored size (and 4 MiB, unless one transposed row is longer), allocated from
  // `pool` as Category::staging, so a budgeted save accounts for it. Unset: a heap buffer.
  void set_staging_pool(MemoryPool* pool) { staging_pool_ = pool; }

  // The header JSON as it will be written (unpadded), and the bytes of the whole file.
  std::string header_json() const;
  uint64_t file_size() const;
  void write(const std::filesystem::path& path) const;

 private:
  struct Item {
    std::string name;
    SafetensorsDType dtype;
    std::vector<int64_t> shape;
    const void* raw = nullptr;  // add_raw
    Tensor tensor;              // add
    bool transpose = false;
    std::function<Tensor()> produce;  // add_deferred: the tensor, made at write()
    std::vector<int64_t> source_shape;
    DType source_dtype = DType::f32;
    std::function<void(const ByteSink&)> source = {};  // add_source
    bool scattered = false;                              // add_scattered
  };
  std::vector<const Item*> ordered() const;
  void check_new_name(const std::string& name) const;

  std::vector<Item> items_;
  std::map<std::string, std::string> metadata_;
  MemoryPool* staging_pool_ = nullptr;
  std::function<void(const ScatterSink&)> scatter_;
};

// A validated, memory-mapped safetensors file. Only the header is parsed up front; tensor bytes
// are read from the mapping on demand, so a 6 GB checkpoint costs no 6 GB buffer.
class SafetensorsReader {
 public:
  // Opens, maps and validates `path`; throws IoError naming the file (and tensor) at fault.
  explicit SafetensorsReader(std::filesystem::path path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Every tensor, in data-section order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;  // nullptr if absent
  const SafetensorsEntry& at(std::string_view name) const;    // IoError if absent
  uint64_t header_size() const { return header_size_; }       // N
  uint64_t data_offset() const { return 8 + header_size_; }
  uint64_t file_size() const { return file_size_; }

  // The stored bytes of a tensor, straight from the mapping.
  const std::byte* bytes(const SafetensorsEntry& entry) const;

  // Copies a tensor into `dst` (contiguous). Its shape must equal the stored shape, or with
  // `transpose` the stored 2-D (rows, cols) must be dst's (cols, rows). Same element type: a
  // bit-exact copy; otherwise F32/BF16/F16 stored convert to f32 or bf16 (round to nearest
  // even). Anything else throws IoError naming the file, the tensor and both sides. Untransposed,
  // it goes 4 MiB of the file at a time and releases each piece's pages (release below).
  void read(const SafetensorsEntry& entry, const Tensor& dst, bool transpose = false) const;
  void read(std::string_view name, const Tensor& dst, bool transpose = false) const {
    read(at(name), dst, transpose);
  }
  // Tells the kernel this process is done with a tensor's bytes (madvise MADV_DONTNEED on the
  // whole pages inside it), so a load that streams tensor by tensor never holds the file's
  // pages beyond the one being read. The bytes stay readable (they are read again from disk).
  void release(const SafetensorsEntry& entry) const;
  // The same for the tensor's bytes before `end` (the whole pages among them), for a reader that
  // goes through one large tensor a range at a time (a resume's 8-bit state of a 7B model is one
  // 6.7 GB tensor): what it has copied leaves RAM as it goes. Always from the tensor's start,
  // not from the range's: the kernel may map a whole large page-cache folio on one fault, so a
  // read just past a released range can map pages of it again (measured: tens of MB stayed).
  void release_before(const SafetensorsEntry& entry, uint64_t end) const;

 private:
  void parse_and_validate();
  void unmap();

  std::filesystem::path path_;
  const std::byte* map_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Largest header the reader accepts (Hugging Face's limit): a larger N is a corrupt file.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

}  // namespace memfit::io
