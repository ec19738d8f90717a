// Plain causal attention on the CPU: OpenMP over (batch, head), and within a head a few small
// products done by one register-tiled micro-kernel (attention_tile.h, dispatched at run time to
// AVX3, AVX2 or scalar) that skips the blocks above the causal diagonal. Per-head products are too
// small for a oneDNN call each to pay off; see the note in attention_bench.cpp for the numbers.
// Mixed precision widens a head's bf16 / f16 operands into per-thread f32 scratch and runs the
// same f32 arithmetic: converting is O(T hs) next to the O(T^2 hs) products, and on Sapphire
// Rapids vdpbf16ps retires at half the FLOP rate of vfmadd231ps (docs/notes/mixed-precision.md),
// so bf16 dot products would not be faster than widening. Grouped-query attention runs forward
// over (batch, query head); backward over (batch, key/value head), each task walking its group's
// query heads in order and summing their dk, dv into the rows it alone owns.
#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/kernel_times.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "memfit/kernels/cpu/attention_tile.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/half_vec.h"

namespace memfit::kernels {
namespace {

constexpr std::string_view kOp = "attention";
constexpr int64_t kKeyBlock = 32;   // keys per block of the transposed-key buffer
constexpr int64_t kDepthChunk = 128;  // head dims per pass over that buffer

// S[t, j] = alpha * x_t . y_j for every t and the keys j of each 32-key block that starts at
// or before t: the blocks above the diagonal are skipped, the entries past t in the diagonal
// block are computed and left for the caller to overwrite. x (T, hs) and y (T, hs) have row
// strides ldx, ldy; S is (T, T). y's block is transposed into a stack buffer first so that the
// micro-kernel streams it along the keys.
void causal_scores(const float* x, int64_t ldx, const float* y, int64_t ldy, int64_t T,
                   int64_t hs, float alpha, float* S) {
  alignas(64) float yt[kDepthChunk * kKeyBlock];
  for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min(kKeyBlock, T - j0));
    const int64_t rows_per_tile = tile::max_rows(nb);
    for (int64_t d0 = 0; d0 < hs; d0 += kDepthChunk) {
      const int64_t dc = std::min(kDepthChunk, hs - d0);
      tile::transpose(y + j0 * ldy + d0, ldy, nb, dc, yt, kKeyBlock);
      for (int64_t t = j0; t < T; t += rows_per_tile) {
        const int rows = static_cast<int>(std::min(rows_per_tile, T - t));
        tile::run(rows, nb, dc, x + t * ldx + d0, ldx, 1, yt, kKeyBlock, S + t * T + j0, T,
                  alpha, d0 > 0);
      }
    }
  }
}

// out (T, hs) (=) P @ X for a lower-triangular P (T, T) (zeros above the diagonal): row tile
// [t0, t0 + rows) needs only the first t0 + rows columns of P.
void lower_times(const float* P, const float* X, int64_t ldx, int64_t T, int64_t hs, float* out,
                 int64_t ldo) {
  for (int64_t n0 = 0; n0 < hs; n0 += tile::kMaxWidth) {
    const int n = static_cast<int>(std::min<int64_t>(tile::kMaxWidth, hs - n0));
    const int64_t rows_per_tile = tile::max_rows(n);
    for (int64_t t0 = 0; t0 < T; t0 += rows_per_tile) {
      const int rows = static_cast<int>(std::min(rows_per_tile, T - t0));
      tile::run(rows, n, t0 + rows, P + t0 * T, T, 1, X + n0, ldx, out + t0 * ldo + n0, ldo, 1.0f,
                false);
    }
  }
}

// out (T, hs) (=, or += if accumulate) P^T @ X for a lower-triangular P: row j of the result
// sums rows t >= j.
void lower_transposed_times(const float* P, const float* X, int64_t ldx, int64_t T, int64_t hs,
                            float* out, int64_t ldo, bool accumulate) {
  for (int64_t n0 = 0; n0 < hs; n0 += tile::kMaxWidth) {
    const int n = static_cast<int>(std::min<int64_t>(tile::kMaxWidth, hs - n0));
    const int64_t rows_per_tile = tile::max_rows(n);
    for (int64_t j0 = 0; j0 < T; j0 += rows_per_tile) {
      const int rows = static_cast<int>(std::min(rows_per_tile, T - j0));
      // A(i, k) = P[j0 + k, j0 + i]: the micro-kernel walks P down its columns.
      tile::run(rows, n, T - j0, P + j0 * T + j0, 1, T, X + j0 * ldx + n0, ldx,
                out + j0 * ldo + n0, ldo, 1.0f, accumulate);
    }
  }
}

// Row t of S: softmax over [0, t], zeros past t.
void causal_softmax(float* S, int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = S + t * T;
    const int64_t n = t + 1;
    const float mx = tile::row_max(row, n);
    const float sum = tile::exp_shift_sum(row, n, mx);
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + T, 0.0f);
  }
}

// D (T, T) holds dP; becomes dS = scale * P * (dP - rowsum(P * dP)), zeros past the diagonal.
void causal_softmax_backward(float* D, const float* P, int64_t T, float scale) {
  for (int64_t t = 0; t < T; ++t) {
    float* d = D + t * T;
    const float* p = P + t * T;
    const int64_t n = t + 1;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) dot += p[j] * d[j];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) d[j] = scale * p[j] * (d[j] - dot);
    std::fill(d + n, d + T, 0.0f);
  }
}

// The sizes of one call. C = NH * hs is the output width, W = (NH + 2 KV) * hs qkv's.
struct Dims {
  int64_t B, T, C, NH, hs;
  AttentionHeads heads;
  int64_t W() const { return heads.qkv_width(hs); }
  int64_t KV() const { return heads.kv; }
  // Columns in a qkv row of query head h's q and of key/value head g's k and v.
  int64_t q_col(int64_t h) const { return h * hs; }
  int64_t k_col(int64_t g) const { return C + g * hs; }
  int64_t v_col(int64_t g) const { return C + (heads.kv + g) * hs; }
};

// "n_head = 12", or "8 query heads and 2 key/value heads", for error messages.
std::string heads_text(const AttentionHeads& heads) {
  return heads.q == heads.kv
             ? fmt::format("n_head = {}", heads.q)
             : fmt::format("{} query heads and {} key/value heads", heads.q, heads.kv);
}

// qkv (B, T, heads.qkv_width(hs)) of `dtype` (any float type if none is given).
Dims check_qkv(const Tensor& qkv, AttentionHeads heads, const DType* dtype = nullptr) {
  const Shape& s = expect_any_shape(qkv, kOp, "qkv", dtype ? *dtype : qkv.dtype());
  MEMFIT_CHECK_DTYPE(half::is_float_type(qkv.dtype()), kOp,
                     "qkv must be f32, bf16 or f16, got {} {}", dtype_name(qkv.dtype()), s);
  MEMFIT_CHECK_SHAPE(heads.q > 0 && heads.kv > 0 && heads.q % heads.kv == 0, kOp,
                     "{} key/value heads must divide {} query heads (qkv {})", heads.kv, heads.q,
                     s);
  const bool mha = heads.q == heads.kv;
  const int64_t parts = heads.q + 2L * heads.kv;  // head-size columns per token
  MEMFIT_CHECK_SHAPE(s.rank() == 3 && s[2] % (mha ? 3 : parts) == 0, kOp,
                     "qkv must be {}, got {}",
                     mha ? std::string("(B, T, 3C)")
                         : fmt::format("(B, T, (q + 2 kv) * hs) = (B, T, {} hs) for {}", parts,
                                       heads_text(heads)),
                     s);
  const int64_t C = mha ? s[2] / 3 : s[2] / parts * heads.q;
  MEMFIT_CHECK_SHAPE(C % heads.q == 0, kOp, "C = {} (qkv {}) is not divisible by {}", C, s,
                     heads_text(heads));
  return {s[0], s[1], C, heads.q, C / heads.q, heads};
}

// t: contiguous, of `shape`, f32, bf16 or f16.
void expect_float(const Tensor& t, std::string_view name, const Shape& shape) {
  MEMFIT_CHECK(t.defined(), kOp, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(half::is_float_type(t.dtype()), kOp, "{} must be f32, bf16 or f16, got {} {}",
                     name, dtype_name(t.dtype()), t.shape());
  expect_tensor(t, kOp, name, shape, t.dtype());
}

int64_t scratch_floats(int64_t T) { return T * T; }

bool is_half(DType t) { return t != DType::f32; }

// Floats of one thread's slice of the mixed forward's workspace.
int64_t forward_slot_floats(int64_t T, int64_t hs, DType qkv, DType att, DType out) {
  return (is_half(qkv) ? 3 * T * hs : 0) + (is_half(att) ? T * T : 0) + (is_half(out) ? T * hs : 0);
}

// And of the backward's: the (T, T) dP / dS scratch, plus f32 copies of the half operands.
int64_t backward_slot_floats(int64_t T, int64_t hs, DType qkv, DType att, DType dout,
                             DType dqkv) {
  return T * T + (is_half(att) ? T * T : 0) + (is_half(qkv) ? 3 * T * hs : 0) +
         (is_half(dout) ? T * hs : 0) + (is_half(dqkv) ? 3 * T * hs : 0);
}

// Thread slices for `tasks` parallel tasks.
int64_t slots_for(int64_t tasks) {
  return std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), tasks));
}

// Head size for output width C, 0 if the heads are no use (the call's checks then throw).
int64_t head_size(int64_t C, const AttentionHeads& heads) { return heads.q > 0 ? C / heads.q : 0; }

// rows x cols of `src` (dtype t, row stride lds) widened into dst (row stride ldd).
void widen_rows(float* dst, int64_t ldd, const void* src, DType t, int64_t lds, int64_t rows,
                int64_t cols) {
  half::dispatch(t, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* p = static_cast<const half::Storage<D>*>(src);
    for (int64_t r = 0; r < rows; ++r) convert_n(D, DType::f32, dst + r * ldd, p + r * lds, cols);
  });
}

// rows x cols of src (row stride lds) rounded into dst (dtype t, row stride ldd).
void narrow_rows(void* dst, DType t, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                 int64_t cols) {
  half::dispatch(t, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* p = static_cast<half::Storage<D>*>(dst);
    for (int64_t r = 0; r < rows; ++r) convert_n(DType::f32, D, p + r * ldd, src + r * lds, cols);
  });
}

// Element offset of (b, t = 0, channel c) in a (B, T, width) tensor.
int64_t offset_of(int64_t b, int64_t T, int64_t width, int64_t c) { return b * T * width + c; }

// Byte pointer to element `offset` of a tensor's data.
template <typename P>
P* elem(P* base, DType t, int64_t offset) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return static_cast<Byte*>(base) + offset * static_cast<int64_t>(dtype_size(t));
}

// The threads a workspace supports at `slot` floats per thread (all of them if slot is 0), or
// a ShapeError that says how much to allocate.
int threads_for(const Tensor& workspace, int64_t slot, size_t want_bytes, int64_t T) {
  const int64_t slots = slot ? workspace.numel() / slot : omp_get_max_threads();
  MEMFIT_CHECK_SHAPE(slots >= 1, kOp,
                     "workspace {} holds {} floats, less than one thread's {} for T = {}; "
                     "allocate attention_*_workspace_bytes() = {} bytes",
                     workspace.shape(), workspace.numel(), slot, T, want_bytes);
  return static_cast<int>(std::min<int64_t>(slots, omp_get_max_threads()));
}

}  // namespace

void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, AttentionHeads heads) {
  KernelScope timed("attention_forward");
  const DType f32 = DType::f32;
  MEMFIT_CHECK_DTYPE(!qkv.defined() || qkv.dtype() == f32, kOp,
                     "qkv must be f32, got {} {}; bf16 and f16 take the overload with a workspace",
                     dtype_name(qkv.dtype()), qkv.shape());
  const Dims d = check_qkv(qkv, heads, &f32);
  const int64_t B = d.B, T = d.T, C = d.C, NH = d.NH, hs = d.hs;
  expect_tensor(out, kOp, "out", Shape{B, T, C});
  expect_tensor(att, kOp, "att", Shape{B, NH, T, T});
  const float* qkv_p = qkv.data<float>();
  float* out_p = out.data<float>();
  float* att_p = att.data<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t W = d.W();

#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH, g = heads.kv_of(static_cast<int>(h));
    const float* row0 = qkv_p + b * T * W;
    float* S = att_p + bh * T * T;
    causal_scores(row0 + d.q_col(h), W, row0 + d.k_col(g), W, T, hs, scale, S);
    causal_softmax(S, T);
    lower_times(S, row0 + d.v_col(g), W, T, hs, out_p + b * T * C + h * hs, C);
  }
}

size_t attention_forward_workspace_bytes(int64_t B, int64_t T, int64_t C, AttentionHeads heads,
                                         DType qkv, DType att, DType out) {
  const int64_t hs = head_size(C, heads);
  return static_cast<size_t>(slots_for(B * heads.q) * forward_slot_floats(T, hs, qkv, att, out)) *
         sizeof(float);
}

void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, Tensor& workspace,
                       AttentionHeads heads) {
  KernelScope timed("attention_forward");
  const Dims d = check_qkv(qkv, heads);
  const int64_t B = d.B, T = d.T, C = d.C, NH = d.NH, hs = d.hs;
  expect_float(out, "out", Shape{B, T, C});
  expect_float(att, "att", Shape{B, NH, T, T});
  const DType qt = qkv.dtype(), pt = att.dtype(), ot = out.dtype();
  if (qt == DType::f32 && pt == DType::f32 && ot == DType::f32)
    return attention_forward(out, att, qkv, heads);
  expect_any_shape(workspace, kOp, "workspace");
  if (B * NH * T == 0) return;
  const int64_t slot = forward_slot_floats(T, hs, qt, pt, ot);
  const int threads = threads_for(
      workspace, slot, attention_forward_workspace_bytes(B, T, C, heads, qt, pt, ot), T);

  const void* qkv_p = qkv.raw_data();
  void* out_p = out.raw_data();
  void* att_p = att.raw_data();
  float* ws = workspace.data<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t W = d.W();

#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH, g = heads.kv_of(static_cast<int>(h));
    const int64_t cols[3] = {d.q_col(h), d.k_col(g), d.v_col(g)};
    float* scratch = ws + omp_get_thread_num() * slot;
    // q, k, v of this head in f32: in place if qkv is f32, else widened into the scratch.
    const float *q, *k, *v;
    int64_t ld;
    if (qt == DType::f32) {
      const float* row0 = static_cast<const float*>(qkv_p) + b * T * W;
      q = row0 + cols[0], k = row0 + cols[1], v = row0 + cols[2], ld = W;
    } else {
      float* qs = scratch;
      scratch += 3 * T * hs;
      for (int part = 0; part < 3; ++part)
        widen_rows(qs + part * T * hs, hs, elem(qkv_p, qt, offset_of(b, T, W, cols[part])), qt, W,
                   T, hs);
      q = qs, k = qs + T * hs, v = qs + 2 * T * hs, ld = hs;
    }
    float* S;
    if (pt == DType::f32) {
      S = static_cast<float*>(att_p) + bh * T * T;
    } else {
      S = scratch;
      scratch += T * T;
    }
    causal_scores(q, ld, k, ld, T, hs, scale, S);
    causal_softmax(S, T);
    if (pt != DType::f32) narrow_rows(elem(att_p, pt, bh * T * T), pt, T * T, S, T * T, 1, T * T);
    if (ot == DType::f32) {
      lower_times(S, v, ld, T, hs, static_cast<float*>(out_p) + offset_of(b, T, C, h * hs), C);
    } else {
      lower_times(S, v, ld, T, hs, scratch, hs);
      narrow_rows(elem(out_p, ot, offset_of(b, T, C, h * hs)), ot, C, scratch, hs, T, hs);
    }
  }
}

size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C,
                                          AttentionHeads heads) {
  return static_cast<size_t>(slots_for(B * heads.kv) * scratch_floats(T)) * sizeof(float);
}

size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, AttentionHeads heads,
                                          DType qkv, DType att, DType dout, DType dqkv) {
  const int64_t hs = head_size(C, heads);
  return static_cast<size_t>(slots_for(B * heads.kv) *
                             backward_slot_floats(T, hs, qkv, att, dout, dqkv)) *
         sizeof(float);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                        Tensor& workspace, AttentionHeads heads) {
  KernelScope timed("attention_backward");
  const Dims d = check_qkv(qkv, heads);
  const int64_t B = d.B, T = d.T, C = d.C, NH = d.NH, hs = d.hs;
  expect_float(dqkv, "dqkv", qkv.shape());
  expect_float(dout, "dout", Shape{B, T, C});
  expect_float(att, "att", Shape{B, NH, T, T});
  expect_any_shape(workspace, kOp, "workspace");
  if (B * NH * T == 0) return;
  const DType qt = qkv.dtype(), pt = att.dtype(), gt = dout.dtype(), dt = dqkv.dtype();
  const bool all_f32 =
      qt == DType::f32 && pt == DType::f32 && gt == DType::f32 && dt == DType::f32;
  // One slice per thread; a smaller workspace runs on fewer threads.
  const int64_t slot = backward_slot_floats(T, hs, qt, pt, gt, dt);
  const int threads = threads_for(
      workspace, slot,
      all_f32 ? attention_backward_workspace_bytes(B, T, C, heads)
              : attention_backward_workspace_bytes(B, T, C, heads, qt, pt, gt, dt),
      T);

  const void* qkv_p = qkv.raw_data();
  const void* dout_p = dout.raw_data();
  const void* att_p = att.raw_data();
  void* dqkv_p = dqkv.raw_data();
  float* ws = workspace.data<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t W = d.W(), KV = d.KV(), group = heads.group();

  // One task per (b, key/value head g): it alone writes dk, dv of g, the sums over the group's
  // query heads in head order, and dq of those heads. With KV == NH that is one head a task.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bg = 0; bg < B * KV; ++bg) {
    const int64_t b = bg / KV, g = bg % KV;
    float* D = ws + omp_get_thread_num() * slot;
    float* scratch = D + T * T;
    // Each operand in f32: in place if it is f32, else widened into the scratch. k and v are
    // the group's; q, dout and att are widened per query head.
    const float *k, *v;
    float* qs = nullptr;
    int64_t lq;
    if (qt == DType::f32) {
      const float* row0 = static_cast<const float*>(qkv_p) + b * T * W;
      k = row0 + d.k_col(g), v = row0 + d.v_col(g), lq = W;
    } else {
      qs = scratch;
      widen_rows(qs + T * hs, hs, elem(qkv_p, qt, offset_of(b, T, W, d.k_col(g))), qt, W, T, hs);
      widen_rows(qs + 2 * T * hs, hs, elem(qkv_p, qt, offset_of(b, T, W, d.v_col(g))), qt, W, T,
                 hs);
      k = qs + T * hs, v = qs + 2 * T * hs, lq = hs;
      scratch += 3 * T * hs;
    }
    float* gs = nullptr;  // f32 copy of dout's head
    if (gt != DType::f32) {
      gs = scratch;
      scratch += T * hs;
    }
    float* ps = nullptr;  // and of att's
    if (pt != DType::f32) {
      ps = scratch;
      scratch += T * T;
    }
    float *dq = nullptr, *dk, *dv;
    int64_t ld;
    if (dt == DType::f32) {
      float* row0 = static_cast<float*>(dqkv_p) + b * T * W;
      dk = row0 + d.k_col(g), dv = row0 + d.v_col(g), ld = W;
    } else {
      dq = scratch, dk = scratch + T * hs, dv = scratch + 2 * T * hs, ld = hs;
    }

    for (int64_t i = 0; i < group; ++i) {
      const int64_t h = g * group + i, bh = b * NH + h;
      const float* q;
      if (qt == DType::f32) {
        q = static_cast<const float*>(qkv_p) + offset_of(b, T, W, d.q_col(h));
      } else {
        widen_rows(qs, hs, elem(qkv_p, qt, offset_of(b, T, W, d.q_col(h))), qt, W, T, hs);
        q = qs;
      }
      const float* dout_bh;
      int64_t lo;
      if (gt == DType::f32) {
        dout_bh = static_cast<const float*>(dout_p) + offset_of(b, T, C, h * hs), lo = C;
      } else {
        widen_rows(gs, hs, elem(dout_p, gt, offset_of(b, T, C, h * hs)), gt, C, T, hs);
        dout_bh = gs, lo = hs;
      }
      const float* P;
      if (pt == DType::f32) {
        P = static_cast<const float*>(att_p) + bh * T * T;
      } else {
        widen_rows(ps, T * T, elem(att_p, pt, bh * T * T), pt, T * T, 1, T * T);
        P = ps;
      }
      if (dt == DType::f32) dq = static_cast<float*>(dqkv_p) + offset_of(b, T, W, d.q_col(h));
      const bool acc = i > 0;  // dk, dv: the first query head sets them, the rest add
      causal_scores(dout_bh, lo, v, lq, T, hs, 1.0f, D);         // dP = dout @ v^T
      causal_softmax_backward(D, P, T, scale);                    // dS, scaled
      lower_times(D, k, lq, T, hs, dq, ld);                       // dq = dS @ k
      lower_transposed_times(D, q, lq, T, hs, dk, ld, acc);       // dk (+)= dS^T @ q
      lower_transposed_times(P, dout_bh, lo, T, hs, dv, ld, acc);  // dv (+)= P^T @ dout
      if (dt != DType::f32)
        narrow_rows(elem(dqkv_p, dt, offset_of(b, T, W, d.q_col(h))), dt, W, dq, hs, T, hs);
    }
    if (dt != DType::f32) {
      narrow_rows(elem(dqkv_p, dt, offset_of(b, T, W, d.k_col(g))), dt, W, dk, hs, T, hs);
      narrow_rows(elem(dqkv_p, dt, offset_of(b, T, W, d.v_col(g))), dt, W, dv, hs, T, hs);
    }
  }
}

}  // namespace memfit::kernels
