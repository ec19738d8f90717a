// Rotary position embedding (RoPE) for the LLaMA family, in Hugging Face's rotate-half
// convention, the one its Llama checkpoints use (their q and k projections are permuted for it):
// a head vector x of size hs is split in halves, and for i < hs/2
//   out[i]        = x[i] cos_i - x[i + hs/2] sin_i
//   out[i + hs/2] = x[i + hs/2] cos_i + x[i] sin_i,   angle_i(t) = t * inv_freq[i].
// Also the inverse frequencies (default and Llama 3 scaled) and the cos/sin table, computed as
// transformers computes them (docs/notes/llama-kernels.md).
#pragma once

#include <span>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/attention_heads.h"

namespace memfit::kernels {

// Llama 3's frequency scaling, config.json's rope_scaling with "rope_type": "llama3" (Llama 3.1,
// 3.2): wavelengths above original_max_position / low_freq_factor are stretched by `factor`,
// those below original_max_position / high_freq_factor are kept, and those between are
// interpolated smoothly. factor 0 (the default) means no scaling.
struct RopeScaling {
  float factor = 0;
  float low_freq_factor = 1;
  float high_freq_factor = 4;
  int original_max_position = 8192;
  bool enabled() const { return factor > 0; }
  bool operator==(const RopeScaling&) const = default;
};

// hs/2 inverse frequencies, as transformers' _compute_default_rope_parameters:
// inv_freq[i] = 1 / theta^(2i/hs), the exponent formed in f32 (float(2i) / float(hs)), the
// power of float(theta) rounded to f32, and the reciprocal in f32. With scaling enabled, then
// as _compute_llama3_parameters, operation by operation in f32. hs even and > 0, theta > 0.
// Checked once against the same formulas run in PyTorch 1.13 on this CPU: bit-identical for hs
// 64 and 128 with theta 1e4 and 5e5, unscaled and with Llama 3.1's and 3.2's scaling. The one
// difference left is the power: ours is correctly rounded, PyTorch's vectorised pow (Sleef,
// within 1 ulp) not always, so other sizes may see an entry 1-2 ulp apart (hs 80, 96 and 128
// with theta 1e6 scaled and 123456.7: 3 of 304 entries). On a GPU, transformers gets CUDA's
// pow instead anyway. rope_test.cpp keeps PyTorch's values for Llama 3.1 as a fixture.
std::vector<float> rope_inv_freq(int head_size, double theta, const RopeScaling& scaling = {});

// table f32 (T, hs): row t holds cos(t * inv_freq[i]) for i < hs/2, then sin(t * inv_freq[i]).
// The angle is rounded to f32 as transformers forms it (float(t) * inv_freq[i]); its cos and sin
// are then correctly rounded (computed in double from that f32 angle), so an entry is within
// half an ulp of cos or sin of the f32 angle (PyTorch's own cos and sin differ from it by at
// most 1 ulp). inv_freq holds hs/2 values. Threads over rows.
void rope_table(Tensor& table, std::span<const float> inv_freq);

// In place on qkv (B, T, heads.qkv_width(hs)), laid out per token as attention_heads.h says
// ([q heads | k heads | v heads]): rotates every q head and every k head of token (b, t) by row
// t of table (table (T_max, hs) f32 with T_max >= T; hs from the table), leaves v untouched.
// qkv f32, bf16 or f16: widened, rotated in f32 (a product and one fused multiply-add), rounded
// once on store. Against the double reference on the same table: within 3e-7 absolute for
// |x| <= 1 in f32 (measured 1.2e-7, the scalar target without fma), plus one rounding to the
// storage type for bf16 / f16 (rope_test.cpp, rope_mixed_test.cpp).
void rope_forward(Tensor& qkv, const Tensor& table, AttentionHeads heads);

// In place on dqkv, laid out as qkv: the transposed rotation (angle -theta) on the dq and dk
// parts, dv untouched; dtypes and accuracy as rope_forward. The rotation has no parameters, so
// the backward needs only the table.
void rope_backward(Tensor& dqkv, const Tensor& table, AttentionHeads heads);

}  // namespace memfit::kernels
