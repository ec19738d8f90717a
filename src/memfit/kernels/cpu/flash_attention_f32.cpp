// Flash attention in f32: FlashAttention-2's forward (tasks of one query tile, online softmax
// over its key tiles) and backward (tasks of one key/value head's key tiles, or a group of them,
// each owning its dk, dv rows and its dq rows of the query heads that share the key/value head),
// on hand-vectorised tile products. See "Note [Flash attention]" in
// docs/notes/flash-attention.md.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/flash_attention_detail.h"

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
  const int64_t BH = d.heads(), nTq = d.q_tiles();
  const float c = d.c();
  const ForwardLayout L = forward_layout(d);

#pragma omp parallel num_threads(nthreads)
  {
    float* base = ws + L.words * omp_get_thread_num();
    float* Qt = base + L.qt;
    float* St = base + L.s;
    float* Vc = base + L.v;
    float* O = base + L.o;
    float* m = base + L.m;
    float* l = base + L.l;
    float* alpha = base + L.alpha;
    // Tasks (b, h, query tile), longest (last) query tiles first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nTq * BH; ++task) {
      const int64_t i = nTq - 1 - task / BH, bh = task % BH;
      const int64_t b = bh / d.NH, h = bh % d.NH, g = d.kv_of(h);
      const int64_t q0 = i * d.Br;
      const int nq = static_cast<int>(std::min<int64_t>(d.Br, T - q0));
      const int nqp = static_cast<int>(round_lanes(nq));
      const float* Qh = qkv + b * T * W + d.q_col(h);
      const float* Kh = qkv + b * T * W + d.k_col(g);
      const float* Vh = qkv + b * T * W + d.v_col(g);

      std::fill(m, m + ldq, -std::numeric_limits<float>::infinity());
      std::fill(l, l + ldq, 0.0f);
      std::fill(O, O + nq * hs, 0.0f);
      transpose_padded(Qt, ldq, Qh + q0 * W, W, nq, hsi);
      // Key tiles up to the diagonal; keys past the tile's last query are never visited.
      for (int64_t k0 = 0; k0 < q0 + nq; k0 += d.Bc) {
        const int nk = static_cast<int>(std::min<int64_t>(d.Bc, q0 + nq - k0));
        gemm_f32(nk, nqp, hsi, Kh + k0 * W, W, 1, Qt, ldq, St, ldq, false);  // S^T = K Q^T
        online_softmax_step(St, ldq, nk, nqp, k0, q0, c, m, l, alpha);
        if (k0 > 0) {
          for (int r = 0; r < nq; ++r) {
            float* o = O + r * hs;
            const float a = alpha[r];
            for (int64_t e = 0; e < hs; ++e) o[e] *= a;
          }
        }
        copy_rows(Vc, hs, Vh + k0 * W, W, nk, hs);
        gemm_f32(nq, hsi, nk, St, 1, ldq, Vc, hs, O, hs, true);  // O += P V, P read from P^T
      }
      for (int r = 0; r < nq; ++r) {
        const float inv = 1.0f / l[r];
        float* o = out + (b * T + q0 + r) * C + h * hs;
        for (int64_t e = 0; e < hs; ++e) o[e] = O[r * hs + e] * inv;
        lse[bh * T + q0 + r] = (m[r] + std::log2(l[r])) * kLn2;
      }
    }
  }
}

void backward_f32(const Dims& d, float* dqkv, const float* dout, const float* qkv,
                  const float* out, const float* lse, float* ws, int nthreads, int groups) {
  const int64_t T = d.T, C = d.C, W = d.qkv_width(), hs = d.hs, ldk = d.Bc, NH = d.NH;
  const int hsi = static_cast<int>(hs);
  const int64_t BH = d.heads(), BKV = d.kv_heads(), KV = d.KV, G = d.group(), nTk = d.kv_tiles();
  const float c = d.c(), scale = d.scale();
  const BackwardLayout L = backward_layout(d);
  float* D = ws;
  // Group 0 adds into dqkv's dq part (row stride W); group g > 0 into dq_buf(g), (B, T, C).
  float* dq_bufs = ws + round_lanes(BH * T);
  auto dq_buf = [&](int g) { return dq_bufs + (g - 1) * dq_words(d); };
  float* scratch = ws + backward_shared_words(d, groups);

  // D = rowsum(dO * O) per (b, h, t), and every dq buffer zeroed: tasks add to them.
#pragma omp parallel for num_threads(nthreads)
  for (int64_t bt = 0; bt < d.B * T; ++bt) {
    const int64_t b = bt / T, t = bt % T;
    for (int64_t h = 0; h < NH; ++h) {
      D[(b * NH + h) * T + t] = dot(dout + bt * C + h * hs, out + bt * C + h * hs, hs);
    }
    std::fill(dqkv + bt * W, dqkv + bt * W + C, 0.0f);
    for (int g = 1; g < groups; ++g) std::fill(dq_buf(g) + bt * C, dq_buf(g) + (bt + 1) * C, 0.0f);
  }

#pragma omp parallel num_threads(nthreads)
  {
    float* base = scratch + L.words * omp_get_thread_num();
    float* Kt = base + L.kt;
    float* Vt = base + L.vt;
    float* Kc = base + L.kc;
    float* Qc = base + L.qc;
    float* dOc = base + L.doc;
    float* S = base + L.s;
    float* dP = base + L.dp;
    float* dK = base + L.dk;
    float* dV = base + L.dv;
    float* lse2 = base + L.lse2;
    // Tasks (group, b, key/value head kh): kh's key tiles of one group, in ascending order, and
    // for each the query heads that share kh, in head order. A task owns the dk, dv rows of its
    // tiles and its group's dq rows of those query heads, so nothing is shared and every sum
    // runs in a fixed order whichever thread takes the task.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < groups * BKV; ++task) {
      const int g = static_cast<int>(task / BKV);
      const int64_t bkv = task % BKV, b = bkv / KV, kh = bkv % KV;
      const float* Kh = qkv + b * T * W + d.k_col(kh);
      const float* Vh = qkv + b * T * W + d.v_col(kh);
      const int64_t ldd = g == 0 ? W : C;

      for (int64_t j = 0; j < nTk; ++j) {
        if (group_of_tile(j, groups) != g) continue;
        const int64_t k0 = j * d.Bc;
        const int nk = static_cast<int>(std::min<int64_t>(d.Bc, T - k0));
        const int nkp = static_cast<int>(round_lanes(nk));
        transpose_padded(Kt, ldk, Kh + k0 * W, W, nk, hsi);
        transpose_padded(Vt, ldk, Vh + k0 * W, W, nk, hsi);
        copy_rows(Kc, hs, Kh + k0 * W, W, nk, hs, scale);
        std::fill(dK, dK + nk * hs, 0.0f);
        std::fill(dV, dV + nk * hs, 0.0f);

        for (int64_t h = kh * G; h < (kh + 1) * G; ++h) {
          const int64_t bh = b * NH + h;
          const float* Qh = qkv + b * T * W + d.q_col(h);
          const float* dOh = dout + b * T * C + h * hs;
          float* dq = g == 0 ? dqkv + b * T * W + d.q_col(h) : dq_buf(g) + b * T * C + h * hs;
          // Query tiles from the one holding the tile's first key to the end.
          for (int64_t q0 = k0 / d.Br * d.Br; q0 < T; q0 += d.Br) {
            const int nq = static_cast<int>(std::min<int64_t>(d.Br, T - q0));
            for (int r = 0; r < nq; ++r) lse2[r] = lse[bh * T + q0 + r] * kLog2e;
            gemm_f32(nq, nkp, hsi, Qh + q0 * W, W, 1, Kt, ldk, S, ldk, false);    // S = Q K^T
            gemm_f32(nq, nkp, hsi, dOh + q0 * C, C, 1, Vt, ldk, dP, ldk, false);  // dP = dO V^T
            probs_and_grads(S, dP, ldk, nq, nk, nkp, q0, k0, c, lse2, D + bh * T + q0);
            copy_rows(dOc, hs, dOh + q0 * C, C, nq, hs);
            copy_rows(Qc, hs, Qh + q0 * W, W, nq, hs);
            gemm_f32(nk, hsi, nq, S, 1, ldk, dOc, hs, dV, hs, true);  // dV += P^T dO
            gemm_f32(nk, hsi, nq, dP, 1, ldk, Qc, hs, dK, hs, true);  // dK += dS^T Q
            gemm_f32(nq, hsi, nk, dP, ldk, 1, Kc, hs, dq + q0 * ldd, ldd, true);  // dq += dS K
          }
        }
        for (int r = 0; r < nk; ++r) {
          float* dk = dqkv + (b * T + k0 + r) * W + d.k_col(kh);
          float* dv = dqkv + (b * T + k0 + r) * W + d.v_col(kh);
          for (int64_t e = 0; e < hs; ++e) {
            dk[e] = scale * dK[r * hs + e];
            dv[e] = dV[r * hs + e];
          }
        }
      }
    }
  }

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
