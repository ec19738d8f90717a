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

// The sizes of one call, checked by flash_attention.cpp.
struct Dims {
  int64_t B = 0, T = 0, C = 0, hs = 0;
  int NH = 0;
  int Br = 0, Bc = 0;  // query rows and key rows per tile, multiples of kLanes
  bool bf16 = false;
  int64_t heads() const { return B * NH; }
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

// Backward runs one task per (b, h, group of key tiles): a task walks its head's key tiles of
// its group in ascending order and adds their dq contributions into the group's own f32 dq
// buffer, so every dq element is summed in a fixed order by one task; the groups' buffers are
// then added in group order. One group per head when there are enough heads to keep the
// threads busy, more when there are few. See "Determinism" in the note.
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

// The drivers. out, dqkv, dout, qkv are (B, T, 3C) or (B, T, C) in the call's dtype; lse is
// (B, NH, T). Forward's ws holds nthreads * forward_thread_words; backward's
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
