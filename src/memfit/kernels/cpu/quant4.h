// 4-bit quantisation of optimizer state, as "Memory Efficient Optimizers with 4-bit States" (Li,
// Chen, Zhu, NeurIPS 2023) stores AdamW's moments: 16-entry maps, two codes a byte (element 2k
// in the low nibble, 2k + 1 in the high one), scaled either by a block's absmax (128 values) or
// by a per-element scale the caller forms (rank-1: min(row max, column max)). See Note [4-bit
// optimizer] (docs/notes/4bit-optimizer.md) for the maps and the choices.
#pragma once

#include <array>
#include <cstdint>

namespace memfit::kernels {

inline constexpr int64_t kQuant4Block = 128;  // values sharing one absmax
inline constexpr int kQuant4Codes = 16;

inline constexpr int64_t quant4_blocks(int64_t n) { return (n + kQuant4Block - 1) / kQuant4Block; }
// Bytes of n packed codes.
inline constexpr int64_t quant4_bytes(int64_t n) { return (n + 1) / 2; }

// A sorted 16-entry map and its decision thresholds.
struct Quant4Map {
  alignas(64) std::array<float, kQuant4Codes> values{};  // ascending
  // thresholds[i]: the midpoint of values[i] and values[i + 1] (in double, rounded once);
  // thresholds[15] is +inf.
  alignas(64) std::array<float, kQuant4Codes> thresholds{};

  // The code of the entry nearest x: the number of thresholds below x, so x on a threshold goes
  // to the lower entry and NaN to code 0.
  uint8_t nearest(float x) const {
    uint8_t c = 0;
    for (int i = 0; i + 1 < kQuant4Codes; ++i) c += x > thresholds[i] ? 1 : 0;
    return c;
  }
};

// The first moment's map: the paper's signed dynamic-exponent map at 4 bits (its code's
// create_dynamic_map(signed=True, max_exponent_bits=3, total_bits=4), torchao's QMAP_SIGNED):
// 0, 1 and +-{0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875}, with the float32 values
// that construction computes.
const Quant4Map& signed_de4_map();
// The second moment's map: the paper's linear map without zero (create_pow_map(4, unsigned, 1),
// torchao's QMAP_UNSIGNED): k / 16 for k = 1..16, so no second moment decodes to 0 (which would
// make 1 / sqrt(v) explode, the paper's zero-point problem).
const Quant4Map& unsigned_linear4_map();

inline uint8_t code4_at(const uint8_t* packed, int64_t i) {
  return static_cast<uint8_t>((packed[i >> 1] >> ((i & 1) * 4)) & 0xf);
}

// One block of n (1..128) values: returns absmax = max |x[i]| and writes the codes of
// x[i] * (1 / absmax) (every code of 0 when absmax is 0) packed to quant4_bytes(n) bytes at
// `packed` (an odd n leaves the last high nibble 0). Vectorised for the SIMD target chosen at
// run time; every target gives the same codes.
float quantize_block4(const float* x, int64_t n, const Quant4Map& map, uint8_t* packed);
// The codes of x[i] / s[i] (0 where s[i] is 0) for n values, packed as above: rank-1 scales.
void quantize_scaled4(const float* x, const float* s, int64_t n, const Quant4Map& map,
                      uint8_t* packed);
// x[i] = map.values[code i] * absmax, for n codes packed at `packed`.
void dequantize_block4(const uint8_t* packed, int64_t n, float absmax, const Quant4Map& map,
                       float* x);
// x[i] = map.values[code i] * s[i].
void dequantize_scaled4(const uint8_t* packed, const float* s, int64_t n, const Quant4Map& map,
                        float* x);

}  // namespace memfit::kernels
