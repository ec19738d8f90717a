// Helpers of the quantized-weight tests (NF4 and int8): a weight in either format that owns its
// bytes, quantized from nf4_test_util.h's weight-like values with the format's kernel, and
// dequantized by the format's reference.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/kernels/ref/int8_ref.h"
#include "memfit/kernels/ref/nf4_ref.h"
#include "nf4_test_util.h"
#include "test_util.h"

namespace memfit::kernels::test {

inline constexpr WeightQuant kWeightQuants[] = {WeightQuant::nf4, WeightQuant::int8};

// A quantized (rows, cols) weight of `format` over its own zeroed buffer.
struct OwnedQuant {
  std::vector<uint32_t> storage;  // 4-byte aligned
  QuantWeight w;
  OwnedQuant(WeightQuant format, int64_t rows, int64_t cols)
      : storage((quant_bytes(format, rows, cols) + 3) / 4, 0u),
        w(QuantWeight::view(format, storage.data(), rows, cols)) {}
  OwnedQuant(const OwnedQuant&) = delete;
  OwnedQuant& operator=(const OwnedQuant&) = delete;

  // weight_values(rows, cols, seed) quantized with the kernel (quant_quantize).
  void quantize(MemoryPool& pool, uint32_t seed) {
    const auto x = weight_values(w.rows(), w.cols(), seed);
    Tensor src = make_tensor(pool, {w.rows(), w.cols()});
    std::copy(x.begin(), x.end(), src.data<float>());
    const auto floats =
        static_cast<int64_t>(quant_quantize_scratch_bytes(w.format, w.rows(), w.cols()) / 4);
    Tensor scratch = make_tensor(pool, {std::max<int64_t>(floats, 1)});
    quant_quantize(src, w, scratch);
  }
};

// The reference's dequantized values of w (f32; bf16-rounded when round_bf16).
inline std::vector<float> dequantized(const QuantWeight& w, bool round_bf16) {
  std::vector<float> out(static_cast<size_t>(w.rows() * w.cols()));
  if (w.format == WeightQuant::nf4)
    ref::nf4_dequantize(w.nf4, out.data(), round_bf16);
  else
    ref::int8_dequantize(w.int8, out.data(), round_bf16);
  return out;
}

}  // namespace memfit::kernels::test
