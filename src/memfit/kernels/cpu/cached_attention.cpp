// The decode step's attention: per (new row, query head) a dot product with every cached key,
// a softmax, and a weighted sum of cached values. O(position * hs) a head, small next to the
// step's matmuls, so plain loops the compiler vectorises; OpenMP over the tasks.
#include "memfit/kernels/cpu/cached_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"

namespace memfit::kernels {
namespace {

// Element i of a row of `dtype` as f32.
inline float load(const void* row, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(row)[i];
    case DType::bf16: return f32_from_bf16(static_cast<const uint16_t*>(row)[i]);
    case DType::f16: return f32_from_f16(static_cast<const uint16_t*>(row)[i]);
    default: return 0;
  }
}

inline void store(void* row, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(row)[i] = x; break;
    case DType::bf16: static_cast<uint16_t*>(row)[i] = bf16_from_f32(x); break;
    case DType::f16: static_cast<uint16_t*>(row)[i] = f16_from_f32(x); break;
    default: break;
  }
}

// n values of a row of `dtype` as f32: the row itself when it is f32, else widened into `tmp`.
inline const float* widen_row(const void* row, DType dtype, int64_t n, float* tmp) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(row);
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) tmp[i] = f32_from_bf16(static_cast<const uint16_t*>(row)[i]);
      return tmp;
    default:
      for (int64_t i = 0; i < n; ++i) tmp[i] = f32_from_f16(static_cast<const uint16_t*>(row)[i]);
      return tmp;
  }
}

constexpr int64_t kMaxHeadSize = 1024;

bool float_type(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

}  // namespace

size_t cached_attention_scores_bytes(int64_t S, AttentionHeads heads, int64_t T_max) {
  return static_cast<size_t>(S) * heads.q * T_max * sizeof(float);
}

void cached_attention_forward(Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                              const Tensor& v_cache, int64_t position, AttentionHeads heads,
                              Tensor& scores) {
  const char* op = "cached_attention";
  MEMFIT_CHECK(heads.q > 0 && heads.kv > 0 && heads.q % heads.kv == 0, op,
               "{} query heads over {} key/value heads", heads.q, heads.kv);
  MEMFIT_CHECK_SHAPE(qkv.rank() == 2 && k_cache.rank() == 2 && v_cache.rank() == 2 &&
                         out.rank() == 2,
                     op, "qkv {}, k_cache {}, v_cache {}, out {}: each must be 2-D", qkv.shape(),
                     k_cache.shape(), v_cache.shape(), out.shape());
  const int64_t S = qkv.size(0), T_max = k_cache.size(0);
  const int64_t hs = out.size(1) / heads.q;
  MEMFIT_CHECK_SHAPE(hs > 0 && out.size(1) == heads.out_width(hs) && out.size(0) == S &&
                         qkv.size(1) == heads.qkv_width(hs) &&
                         k_cache.size(1) == heads.kv * hs && v_cache.shape() == k_cache.shape(),
                     op, "qkv {}, k_cache {}, v_cache {}, out {} for {} query and {} key/value heads",
                     qkv.shape(), k_cache.shape(), v_cache.shape(), out.shape(), heads.q, heads.kv);
  MEMFIT_CHECK_SHAPE(hs <= kMaxHeadSize, op, "head size {} past the kernel's {}", hs,
                     kMaxHeadSize);
  MEMFIT_CHECK_SHAPE(position >= 0 && position + S <= T_max, op,
                     "{} new rows at position {} past the cache's {} positions", S, position,
                     T_max);
  MEMFIT_CHECK_DTYPE(float_type(qkv.dtype()) && float_type(k_cache.dtype()) &&
                         float_type(v_cache.dtype()) && float_type(out.dtype()),
                     op, "qkv {}, caches {} / {}, out {}: f32, bf16 or f16", dtype_name(qkv.dtype()),
                     dtype_name(k_cache.dtype()), dtype_name(v_cache.dtype()),
                     dtype_name(out.dtype()));
  MEMFIT_CHECK(scores.dtype() == DType::f32 &&
                   scores.nbytes() >= cached_attention_scores_bytes(S, heads, T_max),
               op, "scores workspace of {} bytes, need {}", scores.nbytes(),
               cached_attention_scores_bytes(S, heads, T_max));
  const DType dq = qkv.dtype(), dk = k_cache.dtype(), dv = v_cache.dtype(), dout = out.dtype();
  const size_t eq = dtype_size(dq), ek = dtype_size(dk), ev = dtype_size(dv), eo = dtype_size(dout);
  const auto* q_base = static_cast<const std::byte*>(qkv.raw_data());
  const auto* k_base = static_cast<const std::byte*>(k_cache.raw_data());
  const auto* v_base = static_cast<const std::byte*>(v_cache.raw_data());
  auto* o_base = static_cast<std::byte*>(out.raw_data());
  float* score_base = scores.data<float>();
  const int64_t qw = heads.qkv_width(hs), kvw = heads.kv * hs, ow = heads.out_width(hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t tasks = S * heads.q;
  // Small steps (one token of a small model) stay on the calling thread.
  const bool team = tasks * (position + S) * hs > (int64_t{1} << 15);
#pragma omp parallel for schedule(static) if (team)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t s = task / heads.q, h = task % heads.q, kvh = heads.kv_of(static_cast<int>(h));
    const int64_t keys = position + s + 1;
    const std::byte* q = q_base + (s * qw + h * hs) * eq;
    float* p = score_base + task * T_max;
    float qf[kMaxHeadSize], row[kMaxHeadSize], acc[kMaxHeadSize];
    for (int64_t i = 0; i < hs; ++i) qf[i] = load(q, dq, i);
    float mx = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) {
      const float* k = widen_row(k_base + (j * kvw + kvh * hs) * ek, dk, hs, row);
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < hs; ++i) dot += qf[i] * k[i];
      p[j] = dot * scale;
      mx = std::max(mx, p[j]);
    }
    float sum = 0;
    for (int64_t j = 0; j < keys; ++j) sum += p[j] = std::exp(p[j] - mx);
    const float inv = 1.0f / sum;
    std::fill_n(acc, hs, 0.0f);
    for (int64_t j = 0; j < keys; ++j) {
      const float* v = widen_row(v_base + (j * kvw + kvh * hs) * ev, dv, hs, row);
      const float w = p[j];
#pragma omp simd
      for (int64_t i = 0; i < hs; ++i) acc[i] += w * v[i];
    }
    std::byte* o = o_base + (s * ow + h * hs) * eo;
    for (int64_t i = 0; i < hs; ++i) store(o, dout, i, acc[i] * inv);
  }
}

}  // namespace memfit::kernels
