#include "memfit/io/checkpoint/checkpoint_export.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/hf/model_weights.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

// A directory of Hugging Face safetensors (one file or shards with an index): memfit's saves and
// Hugging Face's. Each parameter is read from its memory-mapped file when asked for.
class SafetensorsSource final : public ParamSource {
 public:
  explicit SafetensorsSource(const fs::path& dir)
      : SafetensorsSource(locate_checkpoint(dir).dir,
                          read_model_config(locate_checkpoint(dir).dir / kConfigFile)) {}
  // `dir` as located, read as a model of `config` (checked against its config.json already).
  SafetensorsSource(const fs::path& dir, const ModelConfig& config)
      : dir_(dir),
        config_(config),
        layout_(config_),
        dtype_(stored_type(dir_, config_, layout_)),
        load_(dir_, config_, layout_, dtype_) {}

  const ModelConfig& config() const override { return config_; }
  const ParamLayout& layout() const override { return layout_; }
  DType dtype() const override { return dtype_; }
  void read(const ParamInfo& p, const Tensor& dst) override { load_.read(p, dst); }
  std::string describe() const override {
    return fmt::format("{} ({})", dir_.string(), load_.files().source().filename().string());
  }

 protected:
  void read_part(const ParamInfo& p, int64_t lo, int64_t hi, float* dst) override {
    load_.read_part(p, lo, hi, dst);
  }

 private:
  // The weights' stored type: bf16 when every parameter is stored as BF16, else f32 (F16 and
  // mixed files convert into f32).
  static DType stored_type(const fs::path& dir, const ModelConfig& c, const ParamLayout& layout) {
    const WeightsLoad probe(dir, c, layout, DType::f32);
    for (const ParamInfo& p : layout.params())
      if (probe.stored_dtype(p) != SafetensorsDType::BF16) return DType::f32;
    return DType::bf16;
  }

  fs::path dir_;
  ModelConfig config_;
  ParamLayout layout_;
  DType dtype_;
  WeightsLoad load_;
};

// Pieces of the slab, one per rank (make_slab_pieces_source).
class SlabPiecesSource final : public ParamSource {
 public:
  SlabPiecesSource(const ModelConfig& config, DType dtype, std::vector<SlabPiece> pieces,
                   std::string description)
      : config_(config), layout_(config_), dtype_(dtype), pieces_(std::move(pieces)),
        description_(std::move(description)) {
    int64_t at = 0;
    for (const SlabPiece& p : pieces_) {
      if (p.begin != at || p.end < p.begin || !p.read)
        MEMFIT_THROW(ConfigError, "export",
                     "{}: the pieces do not tile the slab: one covers [{}, {}) where [{}, ...) "
                     "comes next",
                     description_, p.begin, p.end, at);
      at = p.end;
    }
    if (at != layout_.total())
      MEMFIT_THROW(ConfigError, "export", "{}: the pieces cover {} of the slab's {} elements",
                   description_, at, layout_.total());
  }
  const ModelConfig& config() const override { return config_; }
  const ParamLayout& layout() const override { return layout_; }
  DType dtype() const override { return dtype_; }
  void read(const ParamInfo& p, const Tensor& dst) override {
    const int64_t lo = p.offset, hi = p.offset + p.numel;
    auto* out = static_cast<std::byte*>(dst.raw_data());
    const size_t elem = dtype_size(dtype_);
    for (const SlabPiece& piece : pieces_) {
      const int64_t from = std::max(lo, piece.begin), to = std::min(hi, piece.end);
      if (from < to) piece.read(from, to, out + static_cast<size_t>(from - lo) * elem);
    }
    // Padding rows are zero whatever the pieces hold, as a load leaves them.
    if ((p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head) &&
        config_.padded_vocab > config_.vocab_size)
      dst.slice(config_.vocab_size, config_.padded_vocab).zero();
  }
  std::string describe() const override { return description_; }

 protected:
  void read_part(const ParamInfo& p, int64_t lo, int64_t hi, float* dst) override {
    for (const SlabPiece& piece : pieces_) {
      const int64_t from = std::max(p.offset + lo, piece.begin);
      const int64_t to = std::min(p.offset + hi, piece.end);
      if (from >= to) continue;
      float* out = dst + (from - p.offset - lo);
      const int64_t n = to - from;
      if (dtype_ == DType::f32) {
        piece.read(from, to, out);
      } else {
        // bf16 into the front half of out's bytes, widened in place from the last element
        // down (element i's f32 bytes cover bf16 elements 2i and 2i + 1, already read).
        piece.read(from, to, out);
        const auto* h = reinterpret_cast<const uint16_t*>(out);
        for (int64_t i = n - 1; i >= 0; --i) {
          uint16_t x;
          std::memcpy(&x, h + i, 2);
          out[i] = f32_from_bf16(x);
        }
      }
    }
    // Padding rows are zero whatever the pieces hold, as a load leaves them.
    if ((p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head) &&
        config_.padded_vocab > config_.vocab_size) {
      const int64_t real = int64_t{config_.vocab_size} * p.shape[1];
      for (int64_t i = std::max(lo, real); i < hi; ++i) dst[i - lo] = 0.0f;
    }
  }

 private:
  ModelConfig config_;
  ParamLayout layout_;
  DType dtype_;
  std::vector<SlabPiece> pieces_;
  std::string description_;
};

}  // namespace

void ParamSource::read_range(ElementRange range, float* dst) {
  // Alignment gaps stay zero; each parameter's part of the range is read.
  std::fill(dst, dst + range.size(), 0.0f);
  for (const ParamInfo& p : layout().params()) {
    const int64_t lo = std::max(range.begin, p.offset) - p.offset;
    const int64_t hi = std::min(range.end, p.offset + p.numel) - p.offset;
    if (lo < hi) read_part(p, lo, hi, dst + (p.offset + lo - range.begin));
  }
}

std::unique_ptr<ParamSource> make_slab_pieces_source(const ModelConfig& config, DType dtype,
                                                     std::vector<SlabPiece> pieces,
                                                     std::string description) {
  return std::make_unique<SlabPiecesSource>(config, dtype, std::move(pieces),
                                            std::move(description));
}

std::unique_ptr<ParamSource> open_param_source(const fs::path& dir) {
  // A ZeRO-sharded save's weights are in model.safetensors (rank 0 writes it) and, by range, in
  // the shard files; a directory with only the latter is read from them.
  const fs::path found = locate_checkpoint(dir).dir;
  if (!fs::exists(found / kModelFile) && !fs::exists(found / kModelIndexFile) &&
      has_zero_shards(found))
    return open_zero_weights_source(found);
  return std::make_unique<SafetensorsSource>(dir);
}

std::unique_ptr<ParamSource> open_checkpoint_weights(const fs::path& dir,
                                                     const ModelConfig& config, fs::path* where) {
  const ReadCheckpoint saved = read_checkpoint(dir);
  if (where) *where = saved.dir;
  return open_checkpoint_weights(saved, config);
}

std::unique_ptr<ParamSource> open_checkpoint_weights(const ReadCheckpoint& saved,
                                                     const ModelConfig& config) {
  const fs::path& found = saved.dir;
  check_checkpoint_config(saved, config);
  std::error_code ec;
  if (fs::exists(found / kModelFile, ec) || fs::exists(found / kModelIndexFile, ec))
    return std::make_unique<SafetensorsSource>(found, config);
  if (has_zero_shards(found)) return open_zero_weights_source(found, saved.config);
  MEMFIT_THROW(IoError, "checkpoint", "{}: no {} (nor {}, nor {}){}", found.string(), kModelFile,
               kModelIndexFile, kZeroIndexFile, no_weights_hint(found));
}

std::vector<std::string> export_hf(const fs::path& out, ParamSource& source,
                                   const ExportOptions& options) {
  const ModelConfig& c = source.config();
  const ParamLayout& layout = source.layout();
  const DType stored = options.dtype.value_or(source.dtype());
  MEMFIT_CHECK_DTYPE(stored == DType::f32 || stored == DType::bf16, "export",
                     "--dtype must be fp32 or bf16, got {}", dtype_name(stored));
  // One parameter at a time: read into a buffer of its size (from the pool: Category::staging),
  // written (transposed and converted through the writer's bounded staging), let go.
  MemoryPool heap;
  MemoryPool& pool = options.pool ? *options.pool : heap;
  std::vector<ShardTensor> tensors;
  for (const ParamInfo& p : layout.params()) {
    ShardTensor t;
    t.name = hf_param_name(c, p);
    t.transpose = hf_param_transposed(c, p);
    t.dtype = source.dtype();
    t.store_as = stored;
    t.shape.assign(p.shape.begin(), p.shape.end());
    if (p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head)
      t.shape[0] = c.vocab_size;
    t.produce = [&source, &p, &pool, padded = p.shape, vocab = c.vocab_size,
                 rows = t.shape[0]]() {
      Tensor whole =
          Tensor::empty(pool, padded, source.dtype(), Category::staging, "export.param");
      source.read(p, whole);
      return padded[0] == rows ? whole : whole.slice(0, vocab);
    };
    tensors.push_back(std::move(t));
  }
  std::vector<std::string> files;
  write_directory_atomic(
      out,
      [&](const fs::path& tmp) {
        ShardedWriteOptions w;
        w.max_shard_bytes = options.max_shard_bytes;
        w.staging_pool = &pool;
        w.metadata["format"] = "pt";  // transformers refuses safetensors files without it
        files = write_model_safetensors(tmp, tensors, w);
        write_file_atomic(tmp / kConfigFile, model_config_to_hf_json(c, stored).dump(2) + "\n");
        files.emplace_back(kConfigFile);
      },
      {}, {kModelFile, kModelIndexFile});
  return files;
}

}  // namespace memfit::io
