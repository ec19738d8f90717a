// Block-wise 8-bit quantisation of optimizer state, in the manner of bitsandbytes' 8-bit
// optimizers: blocks of 256 values share one FP32 absmax, and each value is stored as the index
// of the nearest entry of a 256-entry dynamic ("tree") map. See Note [8-bit optimizers]
// (docs/notes/8bit-optimizers.md) for the map's construction and its error bounds.
#pragma once

#include <array>
#include <cstdint>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

inline constexpr int64_t kQuantBlock = 256;  // values sharing one absmax
inline constexpr int kQuantCodes = 256;      // entries in a map

// Blocks needed for n values (the last one may be partial).
inline constexpr int64_t quant_blocks(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

// A sorted 256-entry map with its decision thresholds, laid out for the search.
struct QuantMap {
  alignas(64) std::array<float, kQuantCodes> values{};  // ascending
  // thresholds[i] is the midpoint of values[i] and values[i + 1]; thresholds[255] is +inf.
  alignas(64) std::array<float, kQuantCodes> thresholds{};
  // The thresholds of the binary search, level by level, so the AVX-512 path can hold them
  // all in 16 registers and search with permutes instead of gathers (j = 0..31, b* = 0/1):
  // [0, 32) thresholds[8j + 7] (the first five levels, by j); [32, 64) thresholds[8j + 3];
  // [64, 128) at 2j + b6: thresholds[8j + 4 b6 + 1]; [128, 256) at 4j + 2 b6 + b7:
  // thresholds[8j + 4 b6 + 2 b7].
  alignas(64) std::array<float, kQuantCodes> search_tree{};
  bool is_signed = false;

  // Index of the entry nearest to x, by binary search over the thresholds. x exactly on a
  // threshold goes to the lower entry; NaN goes to index 0.
  uint8_t nearest(float x) const;
};

// The construction of bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7,
// total_bits=8): per decade 10^-6 .. 10^0, the midpoints of an evenly spaced split of
// [0.1, 1], finer in larger decades, plus 0 and 1 (and the negated values when signed).
// Values are computed in double and rounded once, so they may differ from bitsandbytes' float32
// arithmetic in the last bit.
QuantMap make_dynamic_map(bool is_signed);
// The two maps the 8-bit optimizers use (first moment: signed; second moment: unsigned),
// built once.
const QuantMap& signed_dynamic_map();
const QuantMap& unsigned_dynamic_map();

// One block of n (1..256) values: returns absmax = max |x[i]| and writes
// q[i] = map.nearest(x[i] / absmax) (with absmax 0, every q[i] is the index of 0).
// Vectorised for the SIMD target chosen at run time; every target gives the same codes.
float quantize_block(const float* x, int64_t n, const QuantMap& map, uint8_t* q);
// The portable scalar path of quantize_block, always compiled: the reference for tests.
float quantize_block_reference(const float* x, int64_t n, const QuantMap& map, uint8_t* q);
// x[i] = map.values[q[i]] * absmax.
void dequantize_block(const uint8_t* q, int64_t n, float absmax, const QuantMap& map, float* x);

// Whole tensors, OpenMP over blocks: x f32 (n values, any shape) to q i8 (n) and absmax f32
// (quant_blocks(n)); and back. The i8 tensor holds the map index as a byte.
void quantize_blockwise(const Tensor& x, Tensor& q, Tensor& absmax, const QuantMap& map);
void dequantize_blockwise(const Tensor& q, const Tensor& absmax, const QuantMap& map, Tensor& x);

}  // namespace memfit::kernels
