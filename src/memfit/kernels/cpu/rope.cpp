// Rotary position embedding in Hugging Face's rotate-half convention (see rope.h), in place on
// the q and k heads of the fused (B, T, (q + 2 kv) hs) projection output: per token the q and k
// heads are the first (q + kv) hs elements, so a row is (q + kv) head vectors rotated by the
// same table row. Each head's halves are loaded as vectors of hs/2 lanes, rotated in f32 and
// stored back (bf16 / f16 widened on load, rounded once on store); rows are split over threads.
// The inverse frequencies and the cos/sin table follow transformers operation by operation
// (docs/notes/llama-kernels.md), so that a Llama checkpoint sees the angles it was trained with.
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/rope.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// Rotates `heads` consecutive head vectors of hs at x by the angles whose cos and sin are
// c[0, hs/2) and s[0, hs/2): forward (kInverse false) or by the opposite angles (backward).
template <bool kInverse, DType D>
void rope_rotate_row(half::Storage<D>* x, const float* c, const float* s, int64_t heads,
                     int64_t hs) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t h2 = hs / 2;
  auto rotate = [&](half::Storage<D>* x1, half::Storage<D>* x2, VF cv, VF sv, VF a, VF b,
                    int64_t k) {
    // forward: a' = a c - b s, b' = b c + a s; inverse: a' = a c + b s, b' = b c - a s.
    const VF ac = hn::Mul(a, cv), bc = hn::Mul(b, cv);
    const VF o1 = kInverse ? hn::MulAdd(b, sv, ac) : hn::NegMulAdd(b, sv, ac);
    const VF o2 = kInverse ? hn::NegMulAdd(a, sv, bc) : hn::MulAdd(a, sv, bc);
    if (k == N) {
      store<D>(d, o1, x1);
      store<D>(d, o2, x2);
    } else {
      store_n<D>(d, o1, x1, k);
      store_n<D>(d, o2, x2, k);
    }
  };
  for (int64_t h = 0; h < heads; ++h) {
    half::Storage<D>* p = x + h * hs;
    int64_t i = 0;
    for (; i + N <= h2; i += N)
      rotate(p + i, p + h2 + i, hn::LoadU(d, c + i), hn::LoadU(d, s + i), load<D>(d, p + i),
             load<D>(d, p + h2 + i), N);
    if (i < h2) {
      const int64_t k = h2 - i;
      rotate(p + i, p + h2 + i, load_n<DType::f32>(d, c + i, k), load_n<DType::f32>(d, s + i, k),
             load_n<D>(d, p + i, k), load_n<D>(d, p + h2 + i, k), k);
    }
  }
}

// Token rows [r0, r1) of qkv (dtype dt, rows of `width` elements): the first `heads` head
// vectors of row r rotated by table row r % T.
void RopeRows(bool inverse, DType dt, void* qkv, const float* table, int64_t r0, int64_t r1,
              int64_t T, int64_t width, int64_t heads, int64_t hs) {
  half::dispatch(dt, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* base = static_cast<half::Storage<D>*>(qkv);
    for (int64_t r = r0; r < r1; ++r) {
      const float* c = table + (r % T) * hs;
      if (inverse)
        rope_rotate_row<true, D>(base + r * width, c, c + hs / 2, heads, hs);
      else
        rope_rotate_row<false, D>(base + r * width, c, c + hs / 2, heads, hs);
    }
  });
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <cmath>
#include <numbers>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/half_vec.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(RopeRows);

namespace {

// a * b rounded to f32 on its own, never fused into a following addition (a build with
// -march=native may contract a * b + c into one fma, which transformers' separate tensor ops
// do not do).
float product(float a, float b) {
  volatile float p = a * b;
  return p;
}

void rope_apply(std::string_view op, bool inverse, Tensor& qkv, const Tensor& table,
                AttentionHeads heads) {
  const Shape& ts = expect_any_shape(table, op, "table");
  MEMFIT_CHECK_SHAPE(ts.rank() == 2 && ts[1] > 0 && ts[1] % 2 == 0, op,
                     "table {} must be (T, head_size) with an even head_size > 0", ts);
  const int64_t T_max = ts[0], hs = ts[1];
  MEMFIT_CHECK(heads.q > 0 && heads.kv > 0 && heads.q % heads.kv == 0, op,
               "{} query heads and {} key/value heads: both must be > 0 and kv must divide q",
               heads.q, heads.kv);
  MEMFIT_CHECK(qkv.defined(), op, "qkv is undefined");
  MEMFIT_CHECK_DTYPE(half::is_float_type(qkv.dtype()), op,
                     "qkv must be f32, bf16 or f16, got {} {}", dtype_name(qkv.dtype()),
                     qkv.shape());
  const Shape& s = expect_any_shape(qkv, op, "qkv", qkv.dtype());
  const int64_t width = heads.qkv_width(hs);
  MEMFIT_CHECK_SHAPE(s.rank() == 3 && s[2] == width, op,
                     "qkv {} must be (B, T, {}) for {} query and {} key/value heads of {}", s,
                     width, heads.q, heads.kv, hs);
  const int64_t B = s[0], T = s[1];
  MEMFIT_CHECK_SHAPE(T <= T_max, op, "qkv {} has {} positions but table {} only {}", s, T, ts,
                     T_max);
  const int64_t R = B * T, nh = heads.q + heads.kv;
  if (R == 0) return;
  void* p = qkv.raw_data();
  const float* tab = table.data<float>();
  const DType dt = qkv.dtype();
#pragma omp parallel if (R * nh * hs > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(RopeRows)(inverse, dt, p, tab, R * tid / nth, R * (tid + 1) / nth, T,
                                   width, nh, hs);
  }
}

}  // namespace

std::vector<float> rope_inv_freq(int head_size, double theta, const RopeScaling& scaling) {
  constexpr std::string_view op = "rope_inv_freq";
  MEMFIT_CHECK(head_size > 0 && head_size % 2 == 0, op, "head_size must be even and > 0, got {}",
               head_size);
  MEMFIT_CHECK(theta > 0 && std::isfinite(theta), op, "theta must be finite and > 0, got {}",
               theta);
  // _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), each
  // step a float32 tensor op: the exponent divides in f32, base (a Python float) is cast to f32
  // for the pow, and `1.0 / t` is t.reciprocal() * 1.0.
  const int h2 = head_size / 2;
  const float base = static_cast<float>(theta);
  std::vector<float> inv(static_cast<size_t>(h2));
  for (int i = 0; i < h2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_size);
    inv[i] = 1.0f / static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
  }
  if (!scaling.enabled()) return inv;

  // _compute_llama3_parameters, operation by operation. Python scalars meet float32 tensors, so
  // each is cast to f32 first; `s / t` is t.reciprocal() * s; the Python-side arithmetic of
  // scalars (the two wavelength bounds, high - low) is in double.
  const float factor = scaling.factor, low = scaling.low_freq_factor,
              high = scaling.high_freq_factor;
  MEMFIT_CHECK(high > low && scaling.original_max_position > 0, op,
               "llama3 scaling needs high_freq_factor > low_freq_factor and "
               "original_max_position > 0, got {}, {} and {}",
               high, low, scaling.original_max_position);
  const double old_len = scaling.original_max_position;
  const auto low_wavelen = static_cast<float>(old_len / static_cast<double>(low));
  const auto high_wavelen = static_cast<float>(old_len / static_cast<double>(high));
  const auto two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const auto band = static_cast<float>(static_cast<double>(high) - static_cast<double>(low));
  const auto old_f = static_cast<float>(old_len);
  for (float& f : inv) {
    const float wavelen = product(1.0f / f, two_pi);
    // wavelen > low_freq_wavelen: divide by factor; < high_freq_wavelen: keep.
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = (product(1.0f / wavelen, old_f) - low) / band;
    const float smoothed = product(1.0f - smooth, scaled) / factor + product(smooth, scaled);
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
  return inv;
}

void rope_table(Tensor& table, std::span<const float> inv_freq) {
  KernelScope timed("rope_table");
  constexpr std::string_view op = "rope_table";
  const Shape& ts = expect_any_shape(table, op, "table");
  const int64_t h2 = static_cast<int64_t>(inv_freq.size());
  MEMFIT_CHECK_SHAPE(ts.rank() == 2 && h2 > 0 && ts[1] == 2 * h2, op,
                     "table {} must be (T, {}) for {} inverse frequencies", ts, 2 * h2, h2);
  const int64_t T = ts[0], hs = ts[1];
  float* p = table.data<float>();
  const float* f = inv_freq.data();
  // freqs = inv_freq @ position (an f32 product, one rounding), emb = cat(freqs, freqs), then
  // cos and sin; here correctly rounded from that f32 angle.
#pragma omp parallel for schedule(static) if (T * hs > kParallelGrain)
  for (int64_t t = 0; t < T; ++t) {
    float* row = p + t * hs;
    for (int64_t i = 0; i < h2; ++i) {
      const double angle = static_cast<float>(t) * f[i];
      row[i] = static_cast<float>(std::cos(angle));
      row[h2 + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope_forward(Tensor& qkv, const Tensor& table, AttentionHeads heads) {
  KernelScope timed("rope_forward");
  rope_apply("rope_forward", false, qkv, table, heads);
}

void rope_backward(Tensor& dqkv, const Tensor& table, AttentionHeads heads) {
  KernelScope timed("rope_backward");
  rope_apply("rope_backward", true, dqkv, table, heads);
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
