// The quantized weight's operations by format (quant_weight.h).
#include "memfit/kernels/cpu/quant_weight.h"

#include <numeric>

#include "memfit/core/error.h"

namespace memfit::kernels {

std::string_view weight_quant_name(WeightQuant q) {
  switch (q) {
    case WeightQuant::nf4: return "nf4";
    case WeightQuant::int8: return "int8";
  }
  return {};
}

QuantWeight QuantWeight::view(WeightQuant format, void* storage, int64_t rows, int64_t cols) {
  switch (format) {
    case WeightQuant::nf4: return Nf4Weight::view(storage, rows, cols);
    case WeightQuant::int8: return Int8Weight::view(storage, rows, cols);
  }
  return {};
}

bool QuantWeight::defined() const {
  switch (format) {
    case WeightQuant::nf4: return nf4.codes != nullptr;
    case WeightQuant::int8: return int8.codes != nullptr;
  }
  return false;
}

size_t quant_bytes(WeightQuant format, int64_t rows, int64_t cols) {
  switch (format) {
    case WeightQuant::nf4: return nf4_bytes(rows, cols);
    case WeightQuant::int8: return int8_bytes(rows, cols);
  }
  return 0;
}

int64_t quant_row_step(WeightQuant format, int64_t cols) {
  switch (format) {
    case WeightQuant::nf4: return kNf4Block / std::gcd(cols, kNf4Block);
    case WeightQuant::int8: return 1;
  }
  return 1;
}

size_t quant_quantize_scratch_bytes(WeightQuant format, int64_t rows, int64_t cols) {
  switch (format) {
    case WeightQuant::nf4: return nf4_quantize_scratch_bytes(rows, cols);
    case WeightQuant::int8: return 0;
  }
  return 0;
}

void quant_quantize_rows(const Tensor& rows, int64_t row0, QuantWeight& w, Tensor& scratch) {
  switch (w.format) {
    case WeightQuant::nf4: return nf4_quantize_rows(rows, row0, w.nf4, scratch);
    case WeightQuant::int8: return int8_quantize_rows(rows, row0, w.int8);
  }
}

void quant_quantize_finish(Tensor& scratch, QuantWeight& w) {
  switch (w.format) {
    case WeightQuant::nf4: return nf4_quantize_absmax(scratch, w.nf4);
    case WeightQuant::int8: return;  // every row was finished with its codes
  }
}

void quant_quantize(const Tensor& src, QuantWeight& w, Tensor& scratch) {
  switch (w.format) {
    case WeightQuant::nf4: return nf4_quantize(src, w.nf4, scratch);
    case WeightQuant::int8: return int8_quantize(src, w.int8);
  }
}

void quant_dequantize_n(const QuantWeight& w, int64_t e0, int64_t n, DType dst_type, void* dst,
                        bool round_bf16) {
  switch (w.format) {
    case WeightQuant::nf4: return nf4_dequantize_n(w.nf4, e0, n, dst_type, dst, round_bf16);
    case WeightQuant::int8: return int8_dequantize_n(w.int8, e0, n, dst_type, dst, round_bf16);
  }
}

void quant_dequantize_tile(const QuantWeight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                           DType dst_type, void* dst, bool round_bf16) {
  switch (w.format) {
    case WeightQuant::nf4:
      return nf4_dequantize_tile(w.nf4, r0, r1, c0, c1, dst_type, dst, round_bf16);
    case WeightQuant::int8:
      return int8_dequantize_tile(w.int8, r0, r1, c0, c1, dst_type, dst, round_bf16);
  }
}

void quant_dequantize_rows(const QuantWeight& w, int64_t row0, Tensor& dst) {
  switch (w.format) {
    case WeightQuant::nf4: return nf4_dequantize_rows(w.nf4, row0, dst);
    case WeightQuant::int8: return int8_dequantize_rows(w.int8, row0, dst);
  }
}

}  // namespace memfit::kernels
