// A QLoRA save's NF4 base file (nf4_base_file.h).
#include "memfit/io/checkpoint/nf4_base_file.h"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/safetensors.h"

namespace memfit::io {

namespace {

constexpr const char* kSlotNames[kLinearSlots] = {"qkv", "attn_out", "fc", "mlp_out"};

std::string matrix_name(const Nf4Matrix& m) {
  return fmt::format("model.layers.{}.{}.nf4", m.layer, kSlotNames[static_cast<size_t>(m.slot)]);
}

size_t matrix_bytes(const Nf4Matrix& m) { return kernels::nf4_bytes(m.rows, m.cols); }

}  // namespace

void save_nf4_base(const std::filesystem::path& file, const Nf4BaseLayout& layout,
                   const Tensor& buffer) {
  MEMFIT_CHECK(buffer.nbytes() >= layout.bytes(), "nf4_base", "a buffer of {} bytes for {}",
               buffer.nbytes(), layout.bytes());
  SafetensorsWriter w;
  const auto* base = static_cast<const std::byte*>(buffer.raw_data());
  for (const Nf4Matrix& m : layout.matrices()) {
    const std::string name = matrix_name(m);
    w.add_raw(name, SafetensorsDType::U8, {static_cast<int64_t>(matrix_bytes(m))}, base + m.at);
    w.set_metadata(name, fmt::format("{}x{}", m.rows, m.cols));
  }
  w.set_metadata("format", "memfit-nf4 (bitsandbytes NF4, block 64, double-quantized absmax)");
  w.write(file);
}

void load_nf4_base(const std::filesystem::path& file, const Nf4BaseLayout& layout,
                   const Tensor& buffer) {
  MEMFIT_CHECK(buffer.nbytes() >= layout.bytes(), "nf4_base", "a buffer of {} bytes for {}",
               buffer.nbytes(), layout.bytes());
  const SafetensorsReader r(file);
  auto* base = static_cast<std::byte*>(buffer.raw_data());
  for (const Nf4Matrix& m : layout.matrices()) {
    const std::string name = matrix_name(m);
    const SafetensorsEntry* e = r.find(name);
    const auto meta = r.metadata().find(name);
    const std::string shape = fmt::format("{}x{}", m.rows, m.cols);
    if (!e || e->dtype != SafetensorsDType::U8 || e->nbytes() != matrix_bytes(m) ||
        meta == r.metadata().end() || meta->second != shape)
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: tensor {} is missing or not this model's NF4 matrix of {} ({} bytes)",
                   file.string(), name, shape, matrix_bytes(m));
    std::memcpy(base + m.at, r.bytes(*e), matrix_bytes(m));
    r.release(*e);
  }
}

}  // namespace memfit::io
