// The task structure both flash attention drivers share (flash_attention_f32.cpp,
// flash_attention_bf16.cpp): which (b, head, tile) each task covers, the order tasks are dealt
// in, and the tiles each task walks. The drivers supply only their tile products and layouts,
// so the f32 and bf16 paths cannot drift apart in the part that fixes the order of every sum
// (the bit-identity over thread counts rests on it). See "Note [Flash attention]",
// "Determinism" and "Grouped-query attention". Not part of memfit's API.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "memfit/kernels/cpu/flash_attention_detail.h"

namespace memfit::kernels::flash {

// One forward task: query tile [q0, q0 + nq) of query head h of batch row b, whose keys and
// values are key/value head g's. nqp is nq rounded up to whole vectors.
struct ForwardTask {
  int64_t b, h, g, bh, q0;
  int nq, nqp;
};

// Runs body(local, task) for every forward task on nthreads threads, where local =
// setup(thread) is made once per thread (its scratch; an AmxScope lives in it for bf16).
// Tasks are dealt dynamically, the longest (last) query tiles first.
template <class Setup, class Body>
void forward_tasks(const Dims& d, int nthreads, Setup setup, Body body) {
  const int64_t BH = d.heads(), nTq = d.q_tiles();
#pragma omp parallel num_threads(nthreads)
  {
    auto local = setup(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nTq * BH; ++task) {
      const int64_t i = nTq - 1 - task / BH, bh = task % BH;
      const int64_t b = bh / d.NH, h = bh % d.NH, q0 = i * d.Br;
      const int nq = static_cast<int>(std::min<int64_t>(d.Br, d.T - q0));
      body(local, ForwardTask{b, h, d.kv_of(h), bh, q0, nq, static_cast<int>(round_lanes(nq))});
    }
  }
}

// The key tiles a forward task visits: [k0, k0 + nk) up to the diagonal; keys after the tile's
// last query are never visited.
template <class Fn>
void forward_key_tiles(const Dims& d, const ForwardTask& t, Fn fn) {
  for (int64_t k0 = 0; k0 < t.q0 + t.nq; k0 += d.Bc) {
    fn(k0, static_cast<int>(std::min<int64_t>(d.Bc, t.q0 + t.nq - k0)));
  }
}

// One backward key tile of a task: keys [k0, k0 + nk) of key/value head kh of batch row b, in
// tile group g (backward_groups); nkp is nk rounded up to whole vectors.
struct BackwardTile {
  int g;
  int64_t b, kh, k0;
  int nk, nkp;
};

// Runs body(local, tile) for every backward task's key tiles on nthreads threads: tasks are
// (group g, b, key/value head kh), dealt dynamically; a task walks kh's key tiles of group g in
// ascending order, so the dk, dv rows of a tile and the group's dq rows of kh's query heads are
// written by one task, in a fixed order, whichever thread takes it.
template <class Setup, class Body>
void backward_tiles(const Dims& d, int nthreads, int groups, Setup setup, Body body) {
  const int64_t BKV = d.kv_heads(), nTk = d.kv_tiles();
#pragma omp parallel num_threads(nthreads)
  {
    auto local = setup(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < groups * BKV; ++task) {
      const int g = static_cast<int>(task / BKV);
      const int64_t bkv = task % BKV, b = bkv / d.KV, kh = bkv % d.KV;
      for (int64_t j = 0; j < nTk; ++j) {
        if (group_of_tile(j, groups) != g) continue;
        const int64_t k0 = j * d.Bc;
        const int nk = static_cast<int>(std::min<int64_t>(d.Bc, d.T - k0));
        body(local, BackwardTile{g, b, kh, k0, nk, static_cast<int>(round_lanes(nk))});
      }
    }
  }
}

// For one backward key tile: fn(h, bh, q0, nq) for each query head h sharing the tile's key/value
// head, in head order, and each query tile from the one holding the tile's first key to the end.
template <class Fn>
void backward_query_tiles(const Dims& d, const BackwardTile& t, Fn fn) {
  const int64_t G = d.group();
  for (int64_t h = t.kh * G; h < (t.kh + 1) * G; ++h) {
    const int64_t bh = t.b * d.NH + h;
    for (int64_t q0 = t.k0 / d.Br * d.Br; q0 < d.T; q0 += d.Br) {
      fn(h, bh, q0, static_cast<int>(std::min<int64_t>(d.Br, d.T - q0)));
    }
  }
}

// D = rowsum(dO * O) per (b, h, t) (E: float or bf16 bits), then zero_row(bt) for each of the
// B * T rows (the driver's dq buffers), one parallel pass.
template <class E, class ZeroRow>
void backward_prologue(const Dims& d, float* D, const E* dout, const E* out, int nthreads,
                       ZeroRow zero_row) {
#pragma omp parallel for num_threads(nthreads)
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const int64_t b = bt / d.T, t = bt % d.T;
    for (int64_t h = 0; h < d.NH; ++h) {
      D[(b * d.NH + h) * d.T + t] = dot(dout + bt * d.C + h * d.hs, out + bt * d.C + h * d.hs, d.hs);
    }
    zero_row(bt);
  }
}

}  // namespace memfit::kernels::flash
