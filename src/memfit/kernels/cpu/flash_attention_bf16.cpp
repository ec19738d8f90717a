// Flash attention on bf16 inputs: the f32 driver's task structure with bf16 tile products and
// f32 accumulation. Every product's operands are packed in pairs along k, padded to whole
// 16 x 16 tiles, so that the same calls run on AMX (TDPBF16PS) where the machine has it and on
// AVX512_BF16 (_mm512_dpbf16_ps) or two FMAs per pair otherwise. Softmax statistics, lse, D and the dq accumulators
// stay f32; P and dS are rounded to bf16 for their products. Heads are found through Dims'
// helpers (flash_attention_detail.h), as in the f32 driver, grouped-query attention included.
// See "Note [Flash attention]".
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/flash_attention_tasks.h"

namespace memfit::kernels::flash {
namespace {

// Padded sizes, in 32-bit words (bf16 pairs) unless named otherwise.
struct Pads {
  int64_t hs2, hs2p;  // pairs along the head dimension, and rounded up to tiles
  int64_t hsp;        // head dimension rounded up to tiles (columns of dk, dv, dq; rows of O^T)
  int64_t br2p, bc2p; // pairs along a query tile / key tile, rounded up to tiles
  explicit Pads(const Dims& d)
      : hs2(d.hs / 2),
        hs2p(round_tile(d.hs / 2)),
        hsp(round_tile(d.hs)),
        br2p(round_tile((d.Br + 1) / 2)),
        bc2p(round_tile((d.Bc + 1) / 2)) {}
};

// Forward scratch of one thread, in words. Padding that is never written stays zero.
struct ForwardLayout {
  int64_t qp, kr, s, pv, vi, vt, o, m, l, alpha, words;
};
ForwardLayout forward_layout(const Dims& d) {
  const Pads p(d);
  Carver c;
  ForwardLayout L{};
  const int64_t ldq = d.Br;
  L.qp = c.take(p.hs2p * ldq);               // Q^T in d pairs [d2][q]: B of S^T
  L.kr = c.take(d.Bc * p.hs2p);              // K rows [key][d2]: A of S^T
  L.s = c.take(std::max<int64_t>(d.Bc, p.hsp) * ldq);  // S^T, then P^T (f32); last, O rows
  L.pv = c.take(p.bc2p * ldq);               // P^T in key pairs [key2][q]: B of O^T
  L.vi = c.take((d.Bc + 1) / 2 * d.hs);      // V in key pairs [key2][d]
  L.vt = c.take(p.hsp * p.bc2p);             // its transpose [d][key2]: A of O^T
  L.o = c.take(p.hsp * ldq);                 // O^T, unnormalised (f32)
  L.m = c.take(ldq);
  L.l = c.take(ldq);
  L.alpha = c.take(ldq);
  L.words = c.words;
  return L;
}

// Backward scratch of one thread, in words.
struct BackwardLayout {
  int64_t kp, vp, ki, qr, dor, s, dp, tmp, pt, dst, qi, doi, dsb, dk, dv, dq, lse2, words;
};
BackwardLayout backward_layout(const Dims& d) {
  const Pads p(d);
  Carver c;
  BackwardLayout L{};
  const int64_t ldk = d.Bc;
  L.kp = c.take(p.hs2p * ldk);            // K^T in d pairs [d2][key]: B of S
  L.vp = c.take(p.hs2p * ldk);            // V^T in d pairs: B of dP
  L.ki = c.take(p.bc2p * p.hsp);          // K in key pairs [key2][d]: B of dQ
  L.qr = c.take(d.Br * p.hs2p);           // Q rows [q][d2]: A of S
  L.dor = c.take(d.Br * p.hs2p);          // dO rows: A of dP
  L.s = c.take(d.Br * ldk);               // S, then P (f32)
  L.dp = c.take(d.Br * ldk);              // dP, then dS (f32)
  L.tmp = c.take((d.Br + 1) / 2 * ldk);   // P or dS in query pairs [q2][key]
  L.pt = c.take(d.Bc * p.br2p);           // its transpose [key][q2]: A of dV
  L.dst = c.take(d.Bc * p.br2p);          // the same for dS: A of dK
  L.qi = c.take(p.br2p * p.hsp);          // Q in query pairs [q2][d]: B of dK
  L.doi = c.take(p.br2p * p.hsp);         // dO in query pairs: B of dV
  L.dsb = c.take(d.Br * p.bc2p);          // dS rows in bf16 [q][key2]: A of dQ
  L.dk = c.take(d.Bc * p.hsp);            // f32 accumulators
  L.dv = c.take(d.Bc * p.hsp);
  L.dq = c.take(d.Br * p.hsp);
  L.lse2 = c.take(d.Br);
  L.words = c.words;
  return L;
}

uint32_t* words_at(float* base, int64_t at) { return reinterpret_cast<uint32_t*>(base + at); }
const uint32_t* as_pairs(const uint16_t* p) { return reinterpret_cast<const uint32_t*>(p); }

// rows x cols bf16 from rows of stride src_rs to rows of stride ld_dst (in elements). memcpy:
// this file is built for the baseline ISA, and glibc's copy is dispatched to the machine's.
void copy_rows(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t src_rs, int64_t rows,
               int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * src_rs, cols * 2);
}

// Zeroes rows [from, to) of a buffer of row stride ld: the k padding of a pair-packed operand.
void zero_rows(uint32_t* buf, int64_t ld, int64_t from, int64_t to, int64_t cols) {
  for (int64_t r = from; r < to; ++r) std::fill(buf + r * ld, buf + r * ld + cols, 0u);
}

}  // namespace

int64_t forward_thread_words_bf16(const Dims& d) { return forward_layout(d).words; }
int64_t backward_thread_words_bf16(const Dims& d) { return backward_layout(d).words; }

void forward_bf16(const Dims& d, uint16_t* out, float* lse, const uint16_t* qkv, float* ws,
                  int nthreads) {
  const Pads p(d);
  const int64_t T = d.T, C = d.C, W = d.qkv_width(), hs = d.hs, ldq = d.Br;
  const int hsi = static_cast<int>(hs), hs2 = static_cast<int>(p.hs2);
  const float c = d.c();
  const ForwardLayout L = forward_layout(d);
  struct Scratch {
    AmxScope amx;  // the tile registers, configured for this thread's tasks
    uint32_t *Qp, *Kr;
    float* St;
    uint32_t *Pv, *Vi, *Vt;
    float *Ot, *m, *l, *alpha;
  };
  auto setup = [&](int thread) {
    float* base = ws + L.words * thread;
    std::fill(base, base + L.words, 0.0f);  // the padding must read as zero
    return Scratch{{},
                   words_at(base, L.qp), words_at(base, L.kr), base + L.s,
                   words_at(base, L.pv), words_at(base, L.vi), words_at(base, L.vt),
                   base + L.o,           base + L.m,           base + L.l,
                   base + L.alpha};
  };
  forward_tasks(d, nthreads, setup, [&](Scratch& s, const ForwardTask& t) {
    const int nq = t.nq, nqp = t.nqp;
    const uint16_t* Qh = qkv + t.b * T * W + d.q_col(t.h);
    const uint16_t* Kh = qkv + t.b * T * W + d.k_col(t.g);
    const uint16_t* Vh = qkv + t.b * T * W + d.v_col(t.g);
    std::fill(s.m, s.m + ldq, -std::numeric_limits<float>::infinity());
    std::fill(s.l, s.l + ldq, 0.0f);
    for (int64_t e = 0; e < hs; ++e) std::fill(s.Ot + e * ldq, s.Ot + e * ldq + nqp, 0.0f);
    transpose_padded(s.Qp, ldq, as_pairs(Qh + t.q0 * W), W / 2, nq, hs2);
    // O^T's first n columns (one per query) times by[q].
    auto scale_queries = [&](const float* by, int n) {
      for (int64_t e = 0; e < hs; ++e) {
        float* o = s.Ot + e * ldq;
        for (int q = 0; q < n; ++q) o[q] *= by[q];
      }
    };
    forward_key_tiles(d, t, [&](int64_t k0, int nk) {
      const int nk2 = (nk + 1) / 2;
      // S^T = K Q^T
      copy_rows(reinterpret_cast<uint16_t*>(s.Kr), 2 * p.hs2p, Kh + k0 * W, W, nk, hs);
      gemm_bf16(nk, nqp, hs2, s.Kr, p.hs2p, s.Qp, ldq, s.St, ldq, false);
      online_softmax_step(s.St, ldq, nk, nqp, k0, t.q0, c, s.m, s.l, s.alpha);
      if (k0 > 0) scale_queries(s.alpha, nqp);
      // O^T += V^T P^T, both in key pairs.
      pack_pairs_interleave(s.Pv, ldq, s.St, ldq, nk, nqp);
      zero_rows(s.Pv, ldq, nk2, round_tile(nk2), nqp);
      pack_pairs_interleave(s.Vi, hs, Vh + k0 * W, W, nk, hsi);
      transpose_padded(s.Vt, p.bc2p, s.Vi, hs, nk2, hsi);
      gemm_bf16(hsi, nqp, nk2, s.Vt, p.bc2p, s.Pv, ldq, s.Ot, ldq, true);
    });
    // out = O / l, rounded: O^T's columns scaled by 1 / l (in alpha's buffer, free now),
    // transposed into S^T's buffer (free too), then its rows converted; the same products and
    // roundings as element by element.
    for (int r = 0; r < nq; ++r) {
      s.alpha[r] = 1.0f / s.l[r];
      lse[t.bh * T + t.q0 + r] = (s.m[r] + std::log2(s.l[r])) * kLn2;
    }
    scale_queries(s.alpha, nq);
    transpose_padded(s.St, p.hsp, s.Ot, ldq, hsi, nq);
    convert_to_bf16(out + (t.b * T + t.q0) * C + t.h * hs, C, s.St, p.hsp, nq, hsi);
  });
}

void backward_bf16(const Dims& d, uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                   const uint16_t* out, const float* lse, float* ws, int nthreads, int groups) {
  const Pads p(d);
  const int64_t T = d.T, C = d.C, W = d.qkv_width(), hs = d.hs, ldk = d.Bc;
  const int hsi = static_cast<int>(hs), hs2 = static_cast<int>(p.hs2);
  const int64_t BH = d.heads();
  const float c = d.c(), scale = d.scale();
  const BackwardLayout L = backward_layout(d);
  float* D = ws;
  // Group g adds its dq into the f32 buffer dq_acc(g), (B, T, C).
  float* dq_bufs = ws + round_lanes(BH * T);
  auto dq_acc = [&](int g) { return dq_bufs + g * dq_words(d); };
  float* scratch = ws + backward_shared_words(d, groups);

  // D, and the f32 dq buffers zeroed.
  backward_prologue(d, D, dout, out, nthreads, [&](int64_t bt) {
    for (int g = 0; g < groups; ++g) std::fill(dq_acc(g) + bt * C, dq_acc(g) + (bt + 1) * C, 0.0f);
  });

  struct Scratch {
    AmxScope amx;  // the tile registers, configured for this thread's tasks
    uint32_t *Kp, *Vp, *Ki, *Qr, *dOr;
    float *S, *dP;
    uint32_t *tmp, *Pt, *dSt, *Qi, *dOi, *dSb;
    float *dK, *dV, *dQ, *lse2;
  };
  auto setup = [&](int thread) {
    float* base = scratch + L.words * thread;
    std::fill(base, base + L.words, 0.0f);  // the padding must read as zero
    return Scratch{{},
                   words_at(base, L.kp),  words_at(base, L.vp),  words_at(base, L.ki),
                   words_at(base, L.qr),  words_at(base, L.dor), base + L.s,
                   base + L.dp,           words_at(base, L.tmp), words_at(base, L.pt),
                   words_at(base, L.dst), words_at(base, L.qi),  words_at(base, L.doi),
                   words_at(base, L.dsb), base + L.dk,           base + L.dv,
                   base + L.dq,           base + L.lse2};
  };
  backward_tiles(d, nthreads, groups, setup, [&](Scratch& s, const BackwardTile& t) {
    const int64_t k0 = t.k0;
    const int nk = t.nk, nkp = t.nkp, nk2 = (nk + 1) / 2;
    const uint16_t* Kh = qkv + t.b * T * W + d.k_col(t.kh);
    const uint16_t* Vh = qkv + t.b * T * W + d.v_col(t.kh);
    transpose_padded(s.Kp, ldk, as_pairs(Kh + k0 * W), W / 2, nk, hs2);
    transpose_padded(s.Vp, ldk, as_pairs(Vh + k0 * W), W / 2, nk, hs2);
    pack_pairs_interleave(s.Ki, p.hsp, Kh + k0 * W, W, nk, hsi);
    zero_rows(s.Ki, p.hsp, nk2, round_tile(nk2), hs);
    std::fill(s.dK, s.dK + d.Bc * p.hsp, 0.0f);
    std::fill(s.dV, s.dV + d.Bc * p.hsp, 0.0f);
    backward_query_tiles(d, t, [&](int64_t h, int64_t bh, int64_t q0, int nq) {
      const uint16_t* Qh = qkv + t.b * T * W + d.q_col(h);
      const uint16_t* dOh = dout + t.b * T * C + h * hs;
      float* acc = dq_acc(t.g) + t.b * T * C + h * hs;
      const int nq2 = (nq + 1) / 2;
      for (int r = 0; r < nq; ++r) s.lse2[r] = lse[bh * T + q0 + r] * kLog2e;
      // S = Q K^T, dP = dO V^T.
      copy_rows(reinterpret_cast<uint16_t*>(s.Qr), 2 * p.hs2p, Qh + q0 * W, W, nq, hs);
      copy_rows(reinterpret_cast<uint16_t*>(s.dOr), 2 * p.hs2p, dOh + q0 * C, C, nq, hs);
      gemm_bf16(nq, nkp, hs2, s.Qr, p.hs2p, s.Kp, ldk, s.S, ldk, false);
      gemm_bf16(nq, nkp, hs2, s.dOr, p.hs2p, s.Vp, ldk, s.dP, ldk, false);
      probs_and_grads(s.S, s.dP, ldk, nq, nk, nkp, q0, k0, c, s.lse2, D + bh * T + q0);
      // dV += P^T dO: P^T in query pairs (pack, then transpose), dO in query pairs.
      pack_pairs_interleave(s.tmp, ldk, s.S, ldk, nq, nkp);
      transpose_padded(s.Pt, p.br2p, s.tmp, ldk, nq2, nkp);
      pack_pairs_interleave(s.dOi, p.hsp, dOh + q0 * C, C, nq, hsi);
      zero_rows(s.dOi, p.hsp, nq2, round_tile(nq2), hs);
      gemm_bf16(nk, hsi, nq2, s.Pt, p.br2p, s.dOi, p.hsp, s.dV, p.hsp, true);
      // dK += dS^T Q, the same way.
      pack_pairs_interleave(s.tmp, ldk, s.dP, ldk, nq, nkp);
      transpose_padded(s.dSt, p.br2p, s.tmp, ldk, nq2, nkp);
      pack_pairs_interleave(s.Qi, p.hsp, Qh + q0 * W, W, nq, hsi);
      zero_rows(s.Qi, p.hsp, nq2, round_tile(nq2), hs);
      gemm_bf16(nk, hsi, nq2, s.dSt, p.br2p, s.Qi, p.hsp, s.dK, p.hsp, true);
      // dQ = dS K: dS rows in bf16, their key padding zero; then added to the group's rows.
      uint16_t* dS16 = reinterpret_cast<uint16_t*>(s.dSb);
      convert_to_bf16(dS16, 2 * p.bc2p, s.dP, ldk, nq, nkp);
      for (int r = 0; r < nq; ++r) {
        std::fill(dS16 + r * 2 * p.bc2p + nkp, dS16 + r * 2 * p.bc2p + 2 * round_tile(nk2),
                  uint16_t{0});
      }
      gemm_bf16(nq, hsi, nk2, s.dSb, p.bc2p, s.Ki, p.hsp, s.dQ, p.hsp, false);
      add_rows(acc + q0 * C, C, s.dQ, p.hsp, nq, hsi);
    });
    uint16_t* rows = dqkv + (t.b * T + k0) * W;
    convert_to_bf16(rows + d.k_col(t.kh), W, s.dK, p.hsp, nk, hsi, scale);
    convert_to_bf16(rows + d.v_col(t.kh), W, s.dV, p.hsp, nk, hsi);
  });

  // dq = group 0 + group 1 + ..., in group order, scaled and rounded to bf16.
#pragma omp parallel for num_threads(nthreads)
  for (int64_t bt = 0; bt < d.B * T; ++bt) {
    float* acc = dq_acc(0) + bt * C;
    const int cols = static_cast<int>(C);
    for (int g = 1; g < groups; ++g) add_rows(acc, C, dq_acc(g) + bt * C, C, 1, cols);
    convert_to_bf16(dqkv + bt * W, W, acc, C, 1, cols, scale);
  }
}

}  // namespace memfit::kernels::flash
