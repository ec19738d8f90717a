// Flash attention drivers: argument checks, the split into (batch, head, tile) tasks over
// OpenMP, scratch layout, and the sequence of tile products and softmax steps of
// FlashAttention-2's forward and backward. The tile arithmetic (and every intrinsic) is in
// flash_attention_tiles.cpp. See "Note [Flash attention]" in docs/notes/flash-attention.md.
#include "memfit/kernels/cpu/flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>
#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/flash_attention_tiles.h"

namespace memfit::kernels {
namespace {

using flash::kLanes;
using flash::round_lanes;

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr std::string_view kForward = "flash_attention_forward";
constexpr std::string_view kBackward = "flash_attention_backward";

// The sizes of one call, checked.
struct Dims {
  int64_t B = 0, T = 0, C = 0, hs = 0;
  int NH = 0;
  int Br = 0, Bc = 0;  // query rows and key rows per tile
  bool bf16 = false;
  int64_t heads() const { return B * NH; }
  int64_t q_tiles() const { return (T + Br - 1) / Br; }
  int64_t kv_tiles() const { return (T + Bc - 1) / Bc; }
  // Scores in base 2: exp(q.k / sqrt(hs)) = exp2(c * q.k).
  float c() const { return kLog2e / std::sqrt(static_cast<float>(hs)); }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hs)); }
};

bool tile_ok(int n) { return n >= kLanes && n <= 512 && n % kLanes == 0; }

Dims make_dims(int64_t B, int64_t T, int64_t C, int n_head, DType dtype,
               const FlashAttentionTiles& tiles, std::string_view op) {
  MEMFIT_CHECK_SHAPE(n_head > 0 && C % n_head == 0, op,
                     "C = {} is not a positive multiple of n_head = {}", C, n_head);
  MEMFIT_CHECK_DTYPE(dtype == DType::f32 || dtype == DType::bf16, op,
                     "qkv must be f32 or bf16, got {}", dtype_name(dtype));
  MEMFIT_CHECK(tile_ok(tiles.q_rows) && tile_ok(tiles.kv_rows), op,
               "tile rows must be multiples of {} in [{}, 512], got q_rows {} kv_rows {}", kLanes,
               kLanes, tiles.q_rows, tiles.kv_rows);
  Dims d;
  d.B = B;
  d.T = T;
  d.C = C;
  d.NH = n_head;
  d.hs = C / n_head;
  d.Br = tiles.q_rows;
  d.Bc = tiles.kv_rows;
  d.bf16 = dtype == DType::bf16;
  MEMFIT_CHECK_SHAPE(!d.bf16 || d.hs % 2 == 0, op,
                     "bf16 needs an even head size, got C = {}, n_head = {} (head size {})", C,
                     n_head, d.hs);
  return d;
}

Dims check_qkv(const Tensor& qkv, int n_head, const FlashAttentionTiles& tiles,
               std::string_view op) {
  MEMFIT_CHECK(qkv.defined(), op, "qkv is undefined");
  const DType dt = qkv.dtype();
  MEMFIT_CHECK_DTYPE(dt == DType::f32 || dt == DType::bf16, op, "qkv must be f32 or bf16, got {} {}",
                     dtype_name(dt), qkv.shape());
  const Shape& s = expect_any_shape(qkv, op, "qkv", dt);
  MEMFIT_CHECK_SHAPE(s.rank() == 3 && s[0] > 0 && s[1] > 0 && s[2] > 0 && s[2] % 3 == 0, op,
                     "qkv must be (B, T, 3C) with B, T, C > 0, got {}", s);
  return make_dims(s[0], s[1], s[2] / 3, n_head, dt, tiles, op);
}

// bf16 rows are read in pairs as uint32 by the tile products.
void check_pair_aligned(const Tensor& t, std::string_view op, std::string_view name) {
  MEMFIT_CHECK_SHAPE(reinterpret_cast<uintptr_t>(t.raw_data()) % 4 == 0, op,
                     "bf16 {} {} must start at an even element", name, t.shape());
}

// Carves per-thread scratch into named buffers, in 4-byte words, each 64-byte aligned.
struct Carver {
  int64_t words = 0;
  int64_t take(int64_t n) {
    const int64_t at = words;
    words += round_lanes(n);
    return at;
  }
};

// Forward scratch of one thread.
struct ForwardLayout {
  int64_t q, s, p, v, o, m, l, alpha, words;
};
ForwardLayout forward_layout(const Dims& d) {
  Carver c;
  ForwardLayout L{};
  const int64_t ldq = d.Br;
  L.q = c.take(d.bf16 ? d.hs / 2 * ldq : d.hs * ldq);  // Q^T (f32) or Q^T in pairs (bf16)
  L.s = c.take(int64_t{d.Bc} * ldq);                   // S^T, then P^T
  L.p = c.take(d.bf16 ? (d.Bc + 1) / 2 * ldq : 0);     // P^T in key pairs (bf16)
  L.v = c.take(d.bf16 ? (d.Bc + 1) / 2 * d.hs : d.Bc * d.hs);  // V rows, packed (f32) or in key pairs
  L.o = c.take(d.Br * d.hs);                           // unnormalised output rows
  L.m = c.take(ldq);
  L.l = c.take(ldq);
  L.alpha = c.take(ldq);
  L.words = c.words;
  return L;
}

// Backward scratch of one thread.
struct BackwardLayout {
  int64_t kt, vt, ki, s, dp, pi, dsi, dsb, qi, doi, dk, dv, lse2, words;
};
BackwardLayout backward_layout(const Dims& d) {
  Carver c;
  BackwardLayout L{};
  const int64_t ldk = d.Bc, hs = d.hs, Br = d.Br, Bc = d.Bc;
  const int64_t br2 = (Br + 1) / 2, bc2 = (Bc + 1) / 2;
  L.kt = c.take(d.bf16 ? hs / 2 * ldk : hs * ldk);  // K^T of the key tile (pairs along d)
  L.vt = c.take(d.bf16 ? hs / 2 * ldk : hs * ldk);  // V^T of the key tile
  L.ki = c.take(d.bf16 ? bc2 * hs : Bc * hs);       // K rows packed (f32) or in key pairs, for dQ
  L.s = c.take(Br * ldk);                           // S, then P
  L.dp = c.take(Br * ldk);                          // dP, then dS
  L.pi = c.take(d.bf16 ? br2 * ldk : 0);            // P in query pairs, for dV (bf16)
  L.dsi = c.take(d.bf16 ? br2 * ldk : 0);           // dS in query pairs, for dK (bf16)
  L.dsb = c.take(d.bf16 ? Br * ldk / 2 : 0);        // dS as bf16 rows, for dQ (bf16)
  L.qi = c.take(d.bf16 ? br2 * hs : Br * hs);       // Q rows packed (f32) or in query pairs
  L.doi = c.take(d.bf16 ? br2 * hs : Br * hs);      // dO rows packed (f32) or in query pairs
  L.dk = c.take(Bc * hs);
  L.dv = c.take(Bc * hs);
  L.lse2 = c.take(Br);
  L.words = c.words;
  return L;
}

// Workspace words before the per-thread scratch: D = rowsum(dO * O) and, for bf16, the f32
// dq accumulator.
int64_t backward_shared_words(const Dims& d) {
  return round_lanes(d.heads() * d.T) + (d.bf16 ? round_lanes(d.B * d.T * d.C) : 0);
}

struct AlignedFloats {
  explicit AlignedFloats(int64_t n)
      : p(static_cast<float*>(::operator new[](static_cast<size_t>(n) * sizeof(float),
                                               std::align_val_t(64)))) {}
  ~AlignedFloats() { ::operator delete[](p, std::align_val_t(64)); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* p;
};

template <typename Elem>
Elem from_f32(float x) {
  if constexpr (std::is_same_v<Elem, float>) {
    return x;
  } else {
    return bf16_from_f32(x);
  }
}
// rows x cols floats from rows of stride src_rs to rows of stride ld_dst, times `scale`. An
// inline loop: rows are a few hundred bytes, where a memcpy call per row costs more than the
// copy.
void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int64_t rows,
               int64_t cols, float scale = 1.0f) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ld_dst;
    const float* s = src + r * src_rs;
    for (int64_t e = 0; e < cols; ++e) d[e] = s[e] * scale;
  }
}
const uint32_t* as_pairs(const uint16_t* p) { return reinterpret_cast<const uint32_t*>(p); }
uint32_t* words_at(float* base, int64_t at) { return reinterpret_cast<uint32_t*>(base + at); }

// Forward over tasks (b, h, query tile), longest tiles first. See "Note [Flash attention]".
template <typename Elem>
void forward_impl(const Dims& d, Elem* out, float* lse, const Elem* qkv) {
  constexpr bool kBf16 = std::is_same_v<Elem, uint16_t>;
  const int64_t T = d.T, C = d.C, C3 = 3 * d.C, hs = d.hs, ldq = d.Br;
  const int64_t BH = d.heads(), nTq = d.q_tiles();
  const float c = d.c();
  const ForwardLayout L = forward_layout(d);
  const int nthreads = omp_get_max_threads();
  AlignedFloats scratch(L.words * nthreads);

#pragma omp parallel num_threads(nthreads)
  {
    float* base = scratch.p + L.words * omp_get_thread_num();
    float* St = base + L.s;
    float* O = base + L.o;
    float* m = base + L.m;
    float* l = base + L.l;
    float* alpha = base + L.alpha;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nTq * BH; ++task) {
      const int64_t i = nTq - 1 - task / BH, bh = task % BH;
      const int64_t b = bh / d.NH, h = bh % d.NH;
      const int64_t q0 = i * d.Br;
      const int nq = static_cast<int>(std::min<int64_t>(d.Br, T - q0));
      const int nqp = static_cast<int>(round_lanes(nq));
      const Elem* Qh = qkv + b * T * C3 + h * hs;
      const Elem* Kh = Qh + C;
      const Elem* Vh = Qh + 2 * C;

      std::fill(m, m + ldq, -std::numeric_limits<float>::infinity());
      std::fill(l, l + ldq, 0.0f);
      std::fill(O, O + nq * hs, 0.0f);
      // Q^T of the tile, zero in the padding columns so their scores are finite.
      if constexpr (kBf16) {
        uint32_t* Qp = words_at(base, L.q);
        if (nq < nqp) std::fill(Qp, Qp + hs / 2 * ldq, 0u);
        flash::pack_pairs_transpose(Qp, ldq, Qh + q0 * C3, C3, nq, static_cast<int>(hs / 2));
      } else {
        flash::transpose_padded(base + L.q, ldq, Qh + q0 * C3, C3, nq, static_cast<int>(hs));
      }
      // Key tiles up to the diagonal; keys past the tile's last query are never visited.
      for (int64_t k0 = 0; k0 < q0 + nq; k0 += d.Bc) {
        const int nk = static_cast<int>(std::min<int64_t>(d.Bc, q0 + nq - k0));
        if constexpr (kBf16) {
          flash::gemm_bf16(nk, nqp, static_cast<int>(hs / 2), as_pairs(Kh + k0 * C3), C3 / 2, 1,
                           words_at(base, L.q), ldq, St, ldq, false);
        } else {
          flash::gemm_f32(nk, nqp, static_cast<int>(hs), Kh + k0 * C3, C3, 1, base + L.q, ldq, St,
                          ldq, false);
        }
        flash::online_softmax_step(St, ldq, nk, nqp, k0, q0, c, m, l, alpha);
        if (k0 > 0) {
          for (int r = 0; r < nq; ++r) {
            float* o = O + r * hs;
            const float a = alpha[r];
            for (int64_t e = 0; e < hs; ++e) o[e] *= a;
          }
        }
        // O += P V, P read from P^T.
        if constexpr (kBf16) {
          uint32_t* Pp = words_at(base, L.p);
          uint32_t* Vp = words_at(base, L.v);
          flash::pack_pairs_interleave(Pp, ldq, St, ldq, nk, nqp);
          flash::pack_pairs_interleave(Vp, hs, Vh + k0 * C3, C3, nk, static_cast<int>(hs));
          flash::gemm_bf16(nq, static_cast<int>(hs), (nk + 1) / 2, Pp, 1, ldq, Vp, hs, O, hs,
                           true);
        } else {
          // Packed so the rows of B are contiguous: at their natural stride of 3C floats they
          // fall into few L1 sets and the product loses about a fifth of its speed.
          float* Vc = base + L.v;
          copy_rows(Vc, hs, Vh + k0 * C3, C3, nk, hs);
          flash::gemm_f32(nq, static_cast<int>(hs), nk, St, 1, ldq, Vc, hs, O, hs, true);
        }
      }
      for (int r = 0; r < nq; ++r) {
        const float inv = 1.0f / l[r];
        Elem* o = out + (b * T + q0 + r) * C + h * hs;
        for (int64_t e = 0; e < hs; ++e) o[e] = from_f32<Elem>(O[r * hs + e] * inv);
        lse[bh * T + q0 + r] = (m[r] + std::log2(l[r])) * kLn2;
      }
    }
  }
}

// One lock per (b, h, query tile) guards the dq rows that tasks of different key tiles add to.
class TileLocks {
 public:
  explicit TileLocks(size_t n) : locks_(n) {
    for (auto& l : locks_) omp_init_lock(&l);
  }
  ~TileLocks() {
    for (auto& l : locks_) omp_destroy_lock(&l);
  }
  TileLocks(const TileLocks&) = delete;
  TileLocks& operator=(const TileLocks&) = delete;
  void lock(int64_t i) { omp_set_lock(&locks_[static_cast<size_t>(i)]); }
  void unlock(int64_t i) { omp_unset_lock(&locks_[static_cast<size_t>(i)]); }

 private:
  std::vector<omp_lock_t> locks_;
};

// Backward over tasks (b, h, key tile), longest first; each owns its dk, dv rows and adds its
// share of dq under the query tile's lock. See "Note [Flash attention]".
template <typename Elem>
void backward_impl(const Dims& d, Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                   const float* lse, float* ws, int nthreads) {
  constexpr bool kBf16 = std::is_same_v<Elem, uint16_t>;
  const int64_t T = d.T, C = d.C, C3 = 3 * d.C, hs = d.hs, ldk = d.Bc, NH = d.NH;
  const int64_t BH = d.heads(), nTq = d.q_tiles(), nTk = d.kv_tiles();
  const float c = d.c(), scale = d.scale();
  const BackwardLayout L = backward_layout(d);
  float* D = ws;
  float* dq_acc = kBf16 ? ws + round_lanes(BH * T) : nullptr;
  float* scratch = ws + backward_shared_words(d);

  // D = rowsum(dO * O) per (b, h, t), and the dq target zeroed.
#pragma omp parallel for num_threads(nthreads)
  for (int64_t bt = 0; bt < d.B * T; ++bt) {
    const int64_t b = bt / T, t = bt % T;
    for (int64_t h = 0; h < NH; ++h) {
      const Elem* go = dout + bt * C + h * hs;
      const Elem* o = out + bt * C + h * hs;
      D[(b * NH + h) * T + t] = flash::dot(go, o, hs);
    }
    if constexpr (kBf16) {
      std::fill(dq_acc + bt * C, dq_acc + (bt + 1) * C, 0.0f);
    } else {
      std::fill(dqkv + bt * C3, dqkv + bt * C3 + C, 0.0f);
    }
  }

  TileLocks locks(static_cast<size_t>(BH * nTq));
#pragma omp parallel num_threads(nthreads)
  {
    float* base = scratch + L.words * omp_get_thread_num();
    float* S = base + L.s;
    float* dP = base + L.dp;
    float* dK = base + L.dk;
    float* dV = base + L.dv;
    float* lse2 = base + L.lse2;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nTk * BH; ++task) {
      const int64_t j = task / BH, bh = task % BH;
      const int64_t b = bh / NH, h = bh % NH;
      const int64_t k0 = j * d.Bc;
      const int nk = static_cast<int>(std::min<int64_t>(d.Bc, T - k0));
      const int nkp = static_cast<int>(round_lanes(nk));
      const int hsi = static_cast<int>(hs);
      const Elem* Qh = qkv + b * T * C3 + h * hs;
      const Elem* Kh = Qh + C;
      const Elem* Vh = Qh + 2 * C;
      const Elem* dOh = dout + b * T * C + h * hs;

      // K^T and V^T of the key tile (zero in the padding columns), kept for all query tiles.
      if constexpr (kBf16) {
        uint32_t* Kp = words_at(base, L.kt);
        uint32_t* Vp = words_at(base, L.vt);
        if (nk < nkp) {
          std::fill(Kp, Kp + hs / 2 * ldk, 0u);
          std::fill(Vp, Vp + hs / 2 * ldk, 0u);
        }
        flash::pack_pairs_transpose(Kp, ldk, Kh + k0 * C3, C3, nk, hsi / 2);
        flash::pack_pairs_transpose(Vp, ldk, Vh + k0 * C3, C3, nk, hsi / 2);
        flash::pack_pairs_interleave(words_at(base, L.ki), hs, Kh + k0 * C3, C3, nk, hsi);
      } else {
        flash::transpose_padded(base + L.kt, ldk, Kh + k0 * C3, C3, nk, hsi);
        flash::transpose_padded(base + L.vt, ldk, Vh + k0 * C3, C3, nk, hsi);
        copy_rows(base + L.ki, hs, Kh + k0 * C3, C3, nk, hs, scale);  // for dq, so scaled
      }
      std::fill(dK, dK + nk * hs, 0.0f);
      std::fill(dV, dV + nk * hs, 0.0f);

      // Query tiles from the one holding the tile's first key to the end.
      for (int64_t q0 = k0 / d.Br * d.Br; q0 < T; q0 += d.Br) {
        const int nq = static_cast<int>(std::min<int64_t>(d.Br, T - q0));
        for (int r = 0; r < nq; ++r) lse2[r] = lse[bh * T + q0 + r] * kLog2e;
        if constexpr (kBf16) {
          flash::gemm_bf16(nq, nkp, hsi / 2, as_pairs(Qh + q0 * C3), C3 / 2, 1,
                           words_at(base, L.kt), ldk, S, ldk, false);
          flash::gemm_bf16(nq, nkp, hsi / 2, as_pairs(dOh + q0 * C), C / 2, 1,
                           words_at(base, L.vt), ldk, dP, ldk, false);
        } else {
          flash::gemm_f32(nq, nkp, hsi, Qh + q0 * C3, C3, 1, base + L.kt, ldk, S, ldk, false);
          flash::gemm_f32(nq, nkp, hsi, dOh + q0 * C, C, 1, base + L.vt, ldk, dP, ldk, false);
        }
        flash::probs_and_grads(S, dP, ldk, nq, nk, nkp, q0, k0, c, lse2, D + bh * T + q0);
        // dV += P^T dO and dK += dS^T Q (the 1/sqrt(hs) of dK is applied at the end).
        const int64_t lock_id = bh * nTq + q0 / d.Br;
        if constexpr (kBf16) {
          uint32_t* Pi = words_at(base, L.pi);
          uint32_t* dSi = words_at(base, L.dsi);
          uint32_t* Qi = words_at(base, L.qi);
          uint32_t* dOi = words_at(base, L.doi);
          uint16_t* dSb = reinterpret_cast<uint16_t*>(base + L.dsb);
          const int nq2 = (nq + 1) / 2;
          flash::pack_pairs_interleave(Pi, ldk, S, ldk, nq, nkp);
          flash::pack_pairs_interleave(dOi, hs, dOh + q0 * C, C, nq, hsi);
          flash::gemm_bf16(nk, hsi, nq2, Pi, 1, ldk, dOi, hs, dV, hs, true);
          flash::pack_pairs_interleave(dSi, ldk, dP, ldk, nq, nkp);
          flash::pack_pairs_interleave(Qi, hs, Qh + q0 * C3, C3, nq, hsi);
          flash::gemm_bf16(nk, hsi, nq2, dSi, 1, ldk, Qi, hs, dK, hs, true);
          // dq += dS K in the f32 accumulator (1/sqrt(hs) applied when it is converted), under
          // the query tile's lock.
          flash::convert_to_bf16(dSb, ldk, dP, ldk, nq, nkp);
          locks.lock(lock_id);
          flash::gemm_bf16(nq, hsi, (nk + 1) / 2, as_pairs(dSb), ldk / 2, 1,
                           words_at(base, L.ki), hs, dq_acc + (b * T + q0) * C + h * hs, C, true);
          locks.unlock(lock_id);
        } else {
          // B operands packed contiguous, as in forward.
          float* Qc = base + L.qi;
          float* dOc = base + L.doi;
          copy_rows(dOc, hs, dOh + q0 * C, C, nq, hs);
          copy_rows(Qc, hs, Qh + q0 * C3, C3, nq, hs);
          flash::gemm_f32(nk, hsi, nq, S, 1, ldk, dOc, hs, dV, hs, true);
          flash::gemm_f32(nk, hsi, nq, dP, 1, ldk, Qc, hs, dK, hs, true);
          // dq += dS (K / sqrt(hs)) straight into dqkv, under the query tile's lock.
          locks.lock(lock_id);
          flash::gemm_f32(nq, hsi, nk, dP, ldk, 1, base + L.ki, hs,
                          dqkv + (b * T + q0) * C3 + h * hs, C3, true);
          locks.unlock(lock_id);
        }
      }
      for (int r = 0; r < nk; ++r) {
        Elem* dk = dqkv + (b * T + k0 + r) * C3 + C + h * hs;
        Elem* dv = dk + C;
        for (int64_t e = 0; e < hs; ++e) {
          dk[e] = from_f32<Elem>(scale * dK[r * hs + e]);
          dv[e] = from_f32<Elem>(dV[r * hs + e]);
        }
      }
    }
  }

  if constexpr (kBf16) {
#pragma omp parallel for num_threads(nthreads)
    for (int64_t bt = 0; bt < d.B * T; ++bt) {
      for (int64_t e = 0; e < C; ++e) dqkv[bt * C3 + e] = bf16_from_f32(scale * dq_acc[bt * C + e]);
    }
  }
}

}  // namespace

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                             const FlashAttentionTiles& tiles) {
  const Dims d = check_qkv(qkv, n_head, tiles, kForward);
  const DType dt = qkv.dtype();
  expect_tensor(out, kForward, "out", {d.B, d.T, d.C}, dt);
  expect_tensor(lse, kForward, "lse", {d.B, d.NH, d.T}, DType::f32);
  if (d.bf16) {
    check_pair_aligned(qkv, kForward, "qkv");
    forward_impl<uint16_t>(d, static_cast<uint16_t*>(out.raw_data()), lse.data<float>(),
                           static_cast<const uint16_t*>(qkv.raw_data()));
  } else {
    forward_impl<float>(d, out.data<float>(), lse.data<float>(), qkv.data<float>());
  }
}

size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, int n_head,
                                                DType dtype, const FlashAttentionTiles& tiles) {
  const Dims d = make_dims(B, T, C, n_head, dtype, tiles, "flash_attention_backward_workspace");
  const int64_t words = backward_shared_words(d) + backward_layout(d).words * omp_get_max_threads();
  return static_cast<size_t>(words) * sizeof(float);
}

void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                              const Tensor& out, const Tensor& lse, Tensor& workspace, int n_head,
                              const FlashAttentionTiles& tiles) {
  const Dims d = check_qkv(qkv, n_head, tiles, kBackward);
  const DType dt = qkv.dtype();
  expect_tensor(dqkv, kBackward, "dqkv", qkv.shape(), dt);
  expect_tensor(dout, kBackward, "dout", {d.B, d.T, d.C}, dt);
  expect_tensor(out, kBackward, "out", {d.B, d.T, d.C}, dt);
  expect_tensor(lse, kBackward, "lse", {d.B, d.NH, d.T}, DType::f32);
  MEMFIT_CHECK(workspace.defined(), kBackward, "workspace is undefined");
  expect_any_shape(workspace, kBackward, "workspace", workspace.dtype());

  // As many threads as the workspace holds tile buffers for, up to omp_get_max_threads().
  const int64_t shared = backward_shared_words(d), per_thread = backward_layout(d).words;
  const int64_t have = static_cast<int64_t>(workspace.nbytes() / sizeof(float));
  const int64_t fit = have >= shared ? (have - shared) / per_thread : 0;
  MEMFIT_CHECK_SHAPE(fit >= 1, kBackward,
                     "workspace {} ({} bytes) is too small: one thread needs {} bytes, "
                     "flash_attention_backward_workspace_bytes gives {}",
                     workspace.shape(), workspace.nbytes(), (shared + per_thread) * 4,
                     flash_attention_backward_workspace_bytes(d.B, d.T, d.C, d.NH, dt, tiles));
  const int nthreads = static_cast<int>(std::min<int64_t>(fit, omp_get_max_threads()));
  float* ws = static_cast<float*>(workspace.raw_data());

  if (d.bf16) {
    check_pair_aligned(qkv, kBackward, "qkv");
    check_pair_aligned(dout, kBackward, "dout");
    backward_impl<uint16_t>(d, static_cast<uint16_t*>(dqkv.raw_data()),
                            static_cast<const uint16_t*>(dout.raw_data()),
                            static_cast<const uint16_t*>(qkv.raw_data()),
                            static_cast<const uint16_t*>(out.raw_data()), lse.data<float>(), ws,
                            nthreads);
  } else {
    backward_impl<float>(d, dqkv.data<float>(), dout.data<float>(), qkv.data<float>(),
                         out.data<float>(), lse.data<float>(), ws, nthreads);
  }
}

}  // namespace memfit::kernels
