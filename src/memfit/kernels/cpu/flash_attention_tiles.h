// Tile-level building blocks of flash attention (flash_attention.cpp): small matrix products
// on L1/L2-resident tiles, the online-softmax step, the probability/gradient step of backward
// and the bf16 packings. Kept apart so the drivers stay portable code and every vector
// instruction lives here: one Highway source dispatched at run time to AVX3, AVX2 or scalar
// (see "Note [SIMD dispatch]"), plus AVX512_BF16 and AMX behind run-time checks.
// See "Note [Flash attention]" in docs/notes/flash-attention.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memfit::kernels::flash {

// Vector width in f32 lanes; tile leading dimensions are padded to a multiple of it.
inline constexpr int kLanes = 16;
inline int64_t round_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// C (M x N, row stride ldc) = (or += if accumulate) A (M x K) * B (K x N), f32, where
// A(m, k) = A[m * a_rs + k * a_cs] (any strides: it is broadcast one element at a time) and
// B's rows are contiguous: B(k, n) = B[k * ldb + n].
void gemm_f32(int M, int N, int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate);

// The same product over bf16 operands in pairs along k (one uint32 holds elements k and k+1,
// k even, the even one in the low half), accumulating in f32. K2 = ceil(K / 2) pairs. A's rows
// hold pairs along k: A(m, k2) = A[m * lda + k2]; B(k2, n) = B[k2 * ldb + n] (the "VNNI"
// layout). Runs on AMX tiles inside an AmxScope where the machine has them, else on
// _mm512_dpbf16_ps (or its emulation, or plain loops). On AMX the product covers whole
// 16 x 16 tiles: A, B must be readable and C writable up to M, N and K2 rounded up to 16, the
// K2 padding of A and B must be zero, and C's rows and columns past M and N get garbage.
void gemm_bf16(int M, int N, int K2, const uint32_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate);

// Rounds up to whole AMX tiles (16 rows, 16 pairs): the padding gemm_bf16 may touch.
inline int64_t round_tile(int64_t n) { return (n + 15) / 16 * 16; }

// While alive, gemm_bf16 on this thread uses AMX (tile registers configured, released at the
// end) if the CPU and OS support it and it is allowed. Construct one per thread per parallel
// region, around the tasks.
class AmxScope {
 public:
  AmxScope();
  ~AmxScope();
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;
};
// Whether AMX can be used here (built with AMX, CPU has it, the OS granted the tile state).
bool amx_supported();
// Process-wide switch, on by default; tests turn it off to cover the AVX512_BF16 path.
void set_amx_allowed(bool allowed);
// Whether this thread is inside an AmxScope that configured the tiles.
bool amx_active();
// gemm_bf16's AMX body (flash_attention_amx.cpp): M, N, K2 multiples of 16. Needs amx_active().
void gemm_amx(int M, int N, int K2, const uint32_t* A, int64_t lda, const uint32_t* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate);

// One key tile of the forward online softmax. St (nk x ld) holds raw scores q.k, key-major:
// St[j * ld + i] for key k0 + j and query q0 + i, i < nqp (a multiple of kLanes). Scores are
// scaled by c (= log2(e) / sqrt(hs)), keys after their query are masked, m (running max, base
// 2) and l (running sum) are updated, St is overwritten with the probabilities exp2(s - m) and
// alpha[i] = exp2(m_old - m_new) is the factor the output rows accumulated so far must take.
void online_softmax_step(float* St, int64_t ld, int nk, int nqp, int64_t k0, int64_t q0, float c,
                         float* m, float* l, float* alpha);

// Backward for one (query tile, key tile) pair. S and dP (nq x ld, query-major) hold raw
// scores q.k and dO.v for query q0 + i and key k0 + j, j < nkp (a multiple of kLanes). On
// return S holds P = exp2(c * s - lse2[i]) (zero for masked keys and keys j >= nk) and dP holds
// dS = P * (dP - D[i]) (without the 1/sqrt(hs) that the caller applies to dq and dk).
void probs_and_grads(float* S, float* dP, int64_t ld, int nq, int nk, int nkp, int64_t q0,
                     int64_t k0, float c, const float* lse2, const float* D);

// dst (cols x round_lanes(rows), row stride ld_dst) = src (rows x cols, row stride src_rs)
// transposed, zero in the padding columns [rows, round_lanes(rows)).
void transpose_padded(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int rows,
                      int cols);
// The same on 32-bit words (bf16 pairs).
void transpose_padded(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t src_rs,
                      int rows, int cols);

// sum_i a[i] * b[i] in f32 (bf16 inputs widened).
float dot(const float* a, const float* b, int64_t n);
float dot(const uint16_t* a, const uint16_t* b, int64_t n);

// bf16 packings. bf16 values are uint16_t (memfit's DType::bf16).
// dst(k2, n) = pair (src(2 k2, n), src(2 k2 + 1, n)) for n < cols, k2 < ceil(rows / 2); an odd
// last row pairs with zero. src rows are contiguous with stride src_rs. The f32 overload rounds
// to nearest even.
void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const uint16_t* src, int64_t src_rs,
                           int rows, int cols);
void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const float* src, int64_t src_rs,
                           int rows, int cols);
// f32 (rows x cols) times scale to bf16, round to nearest even: bf16_from_f32(src * scale)
// element by element (a scale of 1 changes nothing).
void convert_to_bf16(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                     int cols, float scale = 1.0f);
// dst (rows x cols, row stride ld_dst) += src (row stride ld_src), element by element.
void add_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows, int cols);

}  // namespace memfit::kernels::flash
