// A save's quantized base file (quant_base_file.h).
#include "memfit/io/checkpoint/quant_base_file.h"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/safetensors.h"

namespace memfit::io {

namespace {

constexpr const char* kSlotNames[kLinearSlots] = {"qkv", "attn_out", "fc", "mlp_out"};

std::string matrix_name(const QuantBaseLayout& layout, const QuantMatrix& m) {
  return fmt::format("model.layers.{}.{}.{}", m.layer, kSlotNames[static_cast<size_t>(m.slot)],
                     kernels::weight_quant_name(layout.format()));
}

const char* format_note(kernels::WeightQuant format) {
  switch (format) {
    case kernels::WeightQuant::nf4:
      return "memfit-nf4 (bitsandbytes NF4, block 64, double-quantized absmax)";
    case kernels::WeightQuant::int8:
      return "memfit-int8 (int8 codes row-major, then one f32 absmax per row)";
  }
  return "";
}

}  // namespace

std::string quant_base_file(kernels::WeightQuant format) {
  return fmt::format("base_{}.safetensors", kernels::weight_quant_name(format));
}

void save_quant_base(const std::filesystem::path& file, const QuantBaseLayout& layout,
                     const Tensor& buffer) {
  MEMFIT_CHECK(buffer.nbytes() >= layout.bytes(), "quant_base", "a buffer of {} bytes for {}",
               buffer.nbytes(), layout.bytes());
  SafetensorsWriter w;
  const auto* base = static_cast<const std::byte*>(buffer.raw_data());
  for (const QuantMatrix& m : layout.matrices()) {
    const std::string name = matrix_name(layout, m);
    w.add_raw(name, SafetensorsDType::U8, {static_cast<int64_t>(layout.matrix_bytes(m))},
              base + m.at);
    w.set_metadata(name, fmt::format("{}x{}", m.rows, m.cols));
  }
  w.set_metadata("format", format_note(layout.format()));
  w.write(file);
}

void load_quant_base(const std::filesystem::path& file, const QuantBaseLayout& layout,
                     const Tensor& buffer) {
  MEMFIT_CHECK(buffer.nbytes() >= layout.bytes(), "quant_base", "a buffer of {} bytes for {}",
               buffer.nbytes(), layout.bytes());
  const SafetensorsReader r(file);
  auto* base = static_cast<std::byte*>(buffer.raw_data());
  const std::string_view format = kernels::weight_quant_name(layout.format());
  for (const QuantMatrix& m : layout.matrices()) {
    const std::string name = matrix_name(layout, m);
    const SafetensorsEntry* e = r.find(name);
    const auto meta = r.metadata().find(name);
    const std::string shape = fmt::format("{}x{}", m.rows, m.cols);
    const size_t bytes = layout.matrix_bytes(m);
    if (!e || e->dtype != SafetensorsDType::U8 || e->nbytes() != bytes ||
        meta == r.metadata().end() || meta->second != shape)
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: tensor {} is missing or not this model's {} matrix of {} ({} bytes)",
                   file.string(), name, format == "nf4" ? "NF4" : format, shape, bytes);
    std::memcpy(base + m.at, r.bytes(*e), bytes);
    r.release(*e);
  }
}

}  // namespace memfit::io
