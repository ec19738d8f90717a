// The streamed save of the weights of record: see streamed_weights.h and Note [Streamed save].
#include "memfit/io/checkpoint/streamed_weights.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "memfit/core/error.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

using ScatterSink = ShardedWriteOptions::ScatterSink;

int64_t ceil_div(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

// Elements [a, b) (flat, row-major) of a (rows, cols) matrix, at `src`, into their places in
// its stored transpose (cols, rows), for tensor `id` of `sink`. A tile of R rows by C columns
// (R * C within the staging) is transposed into the staging, then each of its columns, which
// is a run of the stored row, is one positioned write. R is as many rows of the run as the
// staging holds, so a column's part of the run is usually one write: about cols writes per
// staging-full of rows. [a, b) may start and end inside a row (a piece of the offload files is
// cut anywhere): a column's rows in the run are still one interval, so no write is smaller
// than what the run holds of that column.
template <class E>
void scatter_transposed(size_t id, int64_t rows, int64_t cols, int64_t a, int64_t b,
                        const std::byte* src, E* staging, int64_t staging_elems,
                        const ScatterSink& sink) {
  const int64_t r_lo = a / cols, r_hi = ceil_div(b, cols);
  const int64_t R = std::max<int64_t>(1, std::min(r_hi - r_lo, staging_elems));
  const int64_t C = std::max<int64_t>(1, std::min(cols, staging_elems / R));
  for (int64_t r0 = r_lo; r0 < r_hi; r0 += R) {
    const int64_t r1 = std::min(r_hi, r0 + R);
    for (int64_t c0 = 0; c0 < cols; c0 += C) {
      const int64_t c1 = std::min(cols, c0 + C);
      // Column j of the tile at staging[(j - c0) * R], its row r at + (r - r0).
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t j0 = std::max(c0, a - r * cols), j1 = std::min(c1, b - r * cols);
        for (int64_t j = j0; j < j1; ++j)
          std::memcpy(&staging[(j - c0) * R + (r - r0)],
                      src + static_cast<size_t>(r * cols + j - a) * sizeof(E), sizeof(E));
      }
      for (int64_t j = c0; j < c1; ++j) {
        // The rows r of the tile with a <= r * cols + j < b.
        const int64_t lo = std::max(r0, ceil_div(a - j, cols));
        const int64_t hi = std::min(r1, ceil_div(b - j, cols));
        if (lo < hi)
          sink(id, static_cast<uint64_t>(j * rows + lo) * sizeof(E),
               &staging[(j - c0) * R + (lo - r0)], static_cast<size_t>(hi - lo) * sizeof(E));
      }
    }
  }
}

}  // namespace

bool has_transposed_weights(const ModelConfig& config, const ParamLayout& layout) {
  for (const ParamInfo& p : layout.params())
    if (hf_param_transposed(config, p)) return true;
  return false;
}

std::vector<std::string> save_weights_streamed(const fs::path& dir, const ModelConfig& config,
                                               const ParamLayout& layout,
                                               const StreamedWeights& record,
                                               const WeightsSaveOptions& options) {
  MEMFIT_CHECK_DTYPE(record.dtype == DType::f32 || record.dtype == DType::bf16, "checkpoint",
                     "the weights of record are f32 or bf16, not {}", dtype_name(record.dtype));
  MEMFIT_CHECK(record.stream, "checkpoint", "a streamed save without a stream");
  const size_t elem = dtype_size(record.dtype);
  const int64_t staging_elems =
      record.staging.defined() ? static_cast<int64_t>(record.staging.nbytes() / elem) : 0;
  MEMFIT_CHECK(staging_elems > 0 || !has_transposed_weights(config, layout), "checkpoint",
               "a streamed save of transposed tensors needs a staging buffer of at least one "
               "element");
  const std::vector<ParamInfo>& params = layout.params();
  std::vector<ShardTensor> tensors;
  std::vector<int64_t> stored;  // each parameter's stored elements (padding rows dropped)
  for (const ParamInfo& p : params) {
    ShardTensor t;
    t.name = hf_param_name(config, p);
    t.scattered = true;
    t.dtype = record.dtype;
    t.shape = hf_param_shape(config, p);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    stored.push_back(n);
    tensors.push_back(std::move(t));
  }
  ShardedWriteOptions w;
  w.max_shard_bytes = options.max_shard_bytes;
  w.metadata["format"] = "pt";  // as save_weights
  w.scatter = [&](size_t first, size_t last, const ScatterSink& sink) {
    const ElementRange range{params[first].offset,
                             params[last - 1].offset + params[last - 1].numel};
    size_t next = first;  // parameters before it are written whole
    record.stream(range, [&](int64_t from, int64_t to, const void* src) {
      const auto* bytes = static_cast<const std::byte*>(src);
      for (size_t i = next; i < last && params[i].offset < to; ++i) {
        const ParamInfo& p = params[i];
        const int64_t a = std::max(from, p.offset), b = std::min(to, p.offset + stored[i]);
        if (a >= b) continue;  // before the run, or its padding rows alone
        const std::byte* at = bytes + static_cast<size_t>(a - from) * elem;
        if (!hf_param_transposed(config, p)) {
          sink(i, static_cast<uint64_t>(a - p.offset) * elem, at,
               static_cast<size_t>(b - a) * elem);
        } else if (elem == 4) {
          scatter_transposed(i, p.shape[0], p.shape[1], a - p.offset, b - p.offset, at,
                             static_cast<uint32_t*>(record.staging.raw_data()), staging_elems,
                             sink);
        } else {
          scatter_transposed(i, p.shape[0], p.shape[1], a - p.offset, b - p.offset, at,
                             static_cast<uint16_t*>(record.staging.raw_data()), staging_elems,
                             sink);
        }
      }
      while (next < last && params[next].offset + params[next].numel <= to) ++next;
    });
  };
  return write_model_safetensors(dir, tensors, w);
}

}  // namespace memfit::io
