// Internals shared by the flash attention drivers: the checked sizes of a call, workspace
// carving, backward's key-tile groups, and the per-dtype drivers that flash_attention.cpp
// dispatches to (flash_attention_f32.cpp, flash_attention_bf16.cpp). Not part of memfit's API.
// See "Note [Flash attention]" in docs/notes/flash-attention.md.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "memfit/kernels/cpu/flash_attention_tiles.h"

namespace memfit::kernels::flash {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

// The sizes of one call, checked by flash_attention.cpp, and where each head lives in qkv. Both
// drivers (and so the AMX products, which see only packed tiles) index through these helpers.
struct Dims {
  int64_t B = 0, T = 0, C = 0, hs = 0;  // C = NH * hs, the width of out and dout
  int NH = 0;          // query heads
  int KV = 0;          // key/value heads, dividing NH (grouped-query attention; NH for GPT-2)
  int Br = 0, Bc = 0;  // query rows and key rows per tile, multiples of kLanes
  bool bf16 = false;
  int64_t heads() const { return B * NH; }     // (b, query head) pairs: rows of lse and D
  int64_t kv_heads() const { return B * KV; }  // (b, key/value head) pairs: backward's tasks
  int group() const { return NH / KV; }        // query heads per key/value head
  int64_t kv_of(int64_t h) const { return h / group(); }
  // qkv's row: [q heads | k heads | v heads], (NH + 2 KV) * hs wide (3C for GPT-2), and the
  // columns of query head h's q and of key/value head g's k and v in it (attention_heads.h).
  int64_t qkv_width() const { return C + 2 * KV * hs; }
  int64_t q_col(int64_t h) const { return h * hs; }
  int64_t k_col(int64_t g) const { return C + g * hs; }
  int64_t v_col(int64_t g) const { return C + (KV + g) * hs; }
  int64_t q_tiles() const { return (T + Br - 1) / Br; }
  int64_t kv_tiles() const { return (T + Bc - 1) / Bc; }
  // Scores in base 2: exp(q.k / sqrt(hs)) = exp2(c * q.k).
  float c() const { return kLog2e / std::sqrt(static_cast<float>(hs)); }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hs)); }
};

// Carves scratch into named buffers, in 4-byte words, each 64-byte aligned.
struct Carver {
  int64_t words = 0;
  int64_t take(int64_t n) {
    const int64_t at = words;
    words += round_lanes(n);
    return at;
  }
};

// Backward runs one task per (group of key tiles, b, key/value head g): a task walks g's key
// tiles of its group in ascending order and, for each, the query heads that share g in head
// order; it sums their dk, dv into the tile's rows, which it alone owns, and adds their dq
// contributions into the group's own f32 dq buffer, so every element is summed in a fixed order
// by one task; the groups' dq buffers are then added in group order. One group when there are
// enough key/value heads to keep the threads busy, more when there are few. See "Determinism"
// and "Grouped-query attention" in the note.
int backward_groups(const Dims& d, int nthreads);
// The group of key tile j among `groups`: dealt in snake order (0 1 2 2 1 0 0 1 2 ...), so the
// long first tiles spread over the groups.
inline int group_of_tile(int64_t j, int groups) {
  const int64_t round = j / groups, pos = j % groups;
  return static_cast<int>(round % 2 == 0 ? pos : groups - 1 - pos);
}

// Workspaces, in words. Backward: what all threads share (D = rowsum(dO * O), the extra f32 dq
// buffers of groups 1.. and, for bf16, group 0's too), then one block of tile buffers per
// thread. Forward: tile buffers per thread only.
int64_t backward_shared_words(const Dims& d, int groups);
int64_t backward_thread_words(const Dims& d);
int64_t forward_thread_words(const Dims& d);
// Words of one f32 dq buffer (B, T, C), 64-byte aligned.
inline int64_t dq_words(const Dims& d) { return round_lanes(d.B * d.T * d.C); }

// The drivers. qkv, dqkv are (B, T, qkv_width()), out, dout (B, T, C), in the call's dtype;
// lse is (B, NH, T). Forward's ws holds nthreads * forward_thread_words; backward's
// backward_shared_words(d, groups) + nthreads * backward_thread_words.
void forward_f32(const Dims& d, float* out, float* lse, const float* qkv, float* ws,
                 int nthreads);
void backward_f32(const Dims& d, float* dqkv, const float* dout, const float* qkv,
                  const float* out, const float* lse, float* ws, int nthreads, int groups);
void forward_bf16(const Dims& d, uint16_t* out, float* lse, const uint16_t* qkv, float* ws,
                  int nthreads);
void backward_bf16(const Dims& d, uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                   const uint16_t* out, const float* lse, float* ws, int nthreads, int groups);
int64_t forward_thread_words_f32(const Dims& d);
int64_t forward_thread_words_bf16(const Dims& d);
int64_t backward_thread_words_f32(const Dims& d);
int64_t backward_thread_words_bf16(const Dims& d);

}  // namespace memfit::kernels::flash
