// Flash attention in f32: FlashAttention-2's forward (tasks of one query tile, online softmax
// over its key tiles) and backward (tasks of one key/value head's key tiles, or a group of them,
// each owning its dk, dv rows and its dq rows of the query heads that share the key/value head),
// on hand-vectorised tile products. See "Note [Flash attention]" in
// docs/notes/flash-attention.md.
#include <algorithm>
#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/flash_attention_tasks.h"

namespace memfit::kernels::flash {
namespace {

// Forward scratch of one thread, in words.
struct ForwardLayout {
  int64_t qt, s, v, o, m, l, alpha, words;
};
ForwardLayout forward_layout(const Dims& d) {
  Carver c;
  ForwardLayout L{};
  const int64_t ldq = d.Br;
  L.qt = c.take(d.hs * ldq);     // Q^T of the query tile, zero past the last query
  L.s = c.take(d.Bc * ldq);      // S^T, then P^T: key-major so the softmax runs across lanes
  L.v = c.take(d.Bc * d.hs);     // V rows of the key tile, contiguous
  L.o = c.take(d.Br * d.hs);     // unnormalised output rows
  L.m = c.take(ldq);             // running max (base 2)
  L.l = c.take(ldq);             // running sum
  L.alpha = c.take(ldq);         // rescale of O for this key tile
  L.words = c.words;
  return L;
}

// Backward scratch of one thread, in words.
struct BackwardLayout {
  int64_t kt, vt, kc, qc, doc, s, dp, dk, dv, lse2, words;
};
BackwardLayout backward_layout(const Dims& d) {
  Carver c;
  BackwardLayout L{};
  const int64_t ldk = d.Bc, hs = d.hs;
  L.kt = c.take(hs * ldk);    // K^T of the key tile, zero past the last key
  L.vt = c.take(hs * ldk);    // V^T of the key tile
  L.kc = c.take(d.Bc * hs);   // K rows / sqrt(hs), contiguous, for dq
  L.qc = c.take(d.Br * hs);   // Q rows of the query tile, contiguous, for dk
  L.doc = c.take(d.Br * hs);  // dO rows of the query tile, contiguous, for dv
  L.s = c.take(d.Br * ldk);   // S, then P
  L.dp = c.take(d.Br * ldk);  // dP, then dS
  L.dk = c.take(d.Bc * hs);
  L.dv = c.take(d.Bc * hs);
  L.lse2 = c.take(d.Br);      // lse in base 2
  L.words = c.words;
  return L;
}

// rows x cols floats from rows of stride src_rs to rows of stride ld_dst, times `scale`. An
// inline loop: a row is a few hundred bytes, where a memcpy call per row costs more than the
// copy. Packing matters: B operands at their natural stride of 3C (or C) floats fall into few
// L1 sets, and the products lose about a fifth of their speed.
void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int64_t rows,
               int64_t cols, float scale = 1.0f) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ld_dst;
    const float* s = src + r * src_rs;
    for (int64_t e = 0; e < cols; ++e) d[e] = s[e] * scale;
  }
}

}  // namespace

int64_t forward_thread_words_f32(const Dims& d) { return forward_layout(d).words; }
int64_t backward_thread_words_f32(const Dims& d) { return backward_layout(d).words; }

void forward_f32(const Dims& d, float* out, float* lse, const float* qkv, float* ws,
                 int nthreads) {
  const int64_t T = d.T, C = d.C, W = d.qkv_width(), hs = d.hs, ldq = d.Br;
  const int hsi = static_cast<int>(hs);
  const float c = d.c();
  const ForwardLayout L = forward_layout(d);
  struct Scratch {
    float *Qt, *St, *Vc, *O, *m, *l, *alpha;
  };
  auto setup = [&](int thread) {
    float* base = ws + L.words * thread;
    return Scratch{base + L.qt, base + L.s,     base + L.v,    base + L.o,
                   base + L.m,  base + L.l,     base + L.alpha};
  };
  forward_tasks(d, nthreads, setup, [&](Scratch& s, const ForwardTask& t) {
    const int nq = t.nq, nqp = t.nqp;
    const float* Qh = qkv + t.b * T * W + d.q_col(t.h);
    const float* Kh = qkv + t.b * T * W + d.k_col(t.g);
    const float* Vh = qkv + t.b * T * W + d.v_col(t.g);
    std::fill(s.m, s.m + ldq, -std::numeric_limits<float>::infinity());
    std::fill(s.l, s.l + ldq, 0.0f);
    std::fill(s.O, s.O + nq * hs, 0.0f);
    transpose_padded(s.Qt, ldq, Qh + t.q0 * W, W, nq, hsi);
    forward_key_tiles(d, t, [&](int64_t k0, int nk) {
      gemm_f32(nk, nqp, hsi, Kh + k0 * W, W, 1, s.Qt, ldq, s.St, ldq, false);  // S^T = K Q^T
      online_softmax_step(s.St, ldq, nk, nqp, k0, t.q0, c, s.m, s.l, s.alpha);
      if (k0 > 0) {
        for (int r = 0; r < nq; ++r) {
          float* o = s.O + r * hs;
          const float a = s.alpha[r];
          for (int64_t e = 0; e < hs; ++e) o[e] *= a;
        }
      }
      copy_rows(s.Vc, hs, Vh + k0 * W, W, nk, hs);
      gemm_f32(nq, hsi, nk, s.St, 1, ldq, s.Vc, hs, s.O, hs, true);  // O += P V, P read from P^T
    });
    for (int r = 0; r < nq; ++r) {
      const float inv = 1.0f / s.l[r];
      float* o = out + (t.b * T + t.q0 + r) * C + t.h * hs;
      for (int64_t e = 0; e < hs; ++e) o[e] = s.O[r * hs + e] * inv;
      lse[t.bh * T + t.q0 + r] = (s.m[r] + std::log2(s.l[r])) * kLn2;
    }
  });
}

void backward_f32(const Dims& d, float* dqkv, const float* dout, const float* qkv,
                  const float* out, const float* lse, float* ws, int nthreads, int groups) {
  const int64_t T = d.T, C = d.C, W = d.qkv_width(), hs = d.hs, ldk = d.Bc;
  const int hsi = static_cast<int>(hs);
  const int64_t BH = d.heads();
  const float c = d.c(), scale = d.scale();
  const BackwardLayout L = backward_layout(d);
  float* D = ws;
  // Group 0 adds into dqkv's dq part (row stride W); group g > 0 into dq_buf(g), (B, T, C).
  float* dq_bufs = ws + round_lanes(BH * T);
  auto dq_buf = [&](int g) { return dq_bufs + (g - 1) * dq_words(d); };
  float* scratch = ws + backward_shared_words(d, groups);

  // D, and every dq buffer zeroed: tasks add to them.
  backward_prologue(d, D, dout, out, nthreads, [&](int64_t bt) {
    std::fill(dqkv + bt * W, dqkv + bt * W + C, 0.0f);
    for (int g = 1; g < groups; ++g) std::fill(dq_buf(g) + bt * C, dq_buf(g) + (bt + 1) * C, 0.0f);
  });

  struct Scratch {
    float *Kt, *Vt, *Kc, *Qc, *dOc, *S, *dP, *dK, *dV, *lse2;
  };
  auto setup = [&](int thread) {
    float* base = scratch + L.words * thread;
    return Scratch{base + L.kt, base + L.vt, base + L.kc, base + L.qc, base + L.doc,
                   base + L.s,  base + L.dp, base + L.dk, base + L.dv, base + L.lse2};
  };
  backward_tiles(d, nthreads, groups, setup, [&](Scratch& s, const BackwardTile& t) {
    const int64_t k0 = t.k0;
    const int nk = t.nk, nkp = t.nkp;
    const float* Kh = qkv + t.b * T * W + d.k_col(t.kh);
    const float* Vh = qkv + t.b * T * W + d.v_col(t.kh);
    const int64_t ldd = t.g == 0 ? W : C;
    transpose_padded(s.Kt, ldk, Kh + k0 * W, W, nk, hsi);
    transpose_padded(s.Vt, ldk, Vh + k0 * W, W, nk, hsi);
    copy_rows(s.Kc, hs, Kh + k0 * W, W, nk, hs, scale);
    std::fill(s.dK, s.dK + nk * hs, 0.0f);
    std::fill(s.dV, s.dV + nk * hs, 0.0f);
    backward_query_tiles(d, t, [&](int64_t h, int64_t bh, int64_t q0, int nq) {
      const float* Qh = qkv + t.b * T * W + d.q_col(h);
      const float* dOh = dout + t.b * T * C + h * hs;
      float* dq = t.g == 0 ? dqkv + t.b * T * W + d.q_col(h) : dq_buf(t.g) + t.b * T * C + h * hs;
      for (int r = 0; r < nq; ++r) s.lse2[r] = lse[bh * T + q0 + r] * kLog2e;
      gemm_f32(nq, nkp, hsi, Qh + q0 * W, W, 1, s.Kt, ldk, s.S, ldk, false);    // S = Q K^T
      gemm_f32(nq, nkp, hsi, dOh + q0 * C, C, 1, s.Vt, ldk, s.dP, ldk, false);  // dP = dO V^T
      probs_and_grads(s.S, s.dP, ldk, nq, nk, nkp, q0, k0, c, s.lse2, D + bh * T + q0);
      copy_rows(s.dOc, hs, dOh + q0 * C, C, nq, hs);
      copy_rows(s.Qc, hs, Qh + q0 * W, W, nq, hs);
      gemm_f32(nk, hsi, nq, s.S, 1, ldk, s.dOc, hs, s.dV, hs, true);  // dV += P^T dO
      gemm_f32(nk, hsi, nq, s.dP, 1, ldk, s.Qc, hs, s.dK, hs, true);  // dK += dS^T Q
      gemm_f32(nq, hsi, nk, s.dP, ldk, 1, s.Kc, hs, dq + q0 * ldd, ldd, true);  // dq += dS K
    });
    for (int r = 0; r < nk; ++r) {
      float* dk = dqkv + (t.b * T + k0 + r) * W + d.k_col(t.kh);
      float* dv = dqkv + (t.b * T + k0 + r) * W + d.v_col(t.kh);
      for (int64_t e = 0; e < hs; ++e) {
        dk[e] = scale * s.dK[r * hs + e];
        dv[e] = s.dV[r * hs + e];
      }
    }
  });

  // dq = group 0 + group 1 + ..., in group order.
  if (groups > 1) {
#pragma omp parallel for num_threads(nthreads)
    for (int64_t bt = 0; bt < d.B * T; ++bt) {
      float* dq = dqkv + bt * W;
      for (int g = 1; g < groups; ++g) {
        const float* src = dq_buf(g) + bt * C;
        for (int64_t e = 0; e < C; ++e) dq[e] += src[e];
      }
    }
  }
}

}  // namespace memfit::kernels::flash
