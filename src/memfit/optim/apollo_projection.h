// APOLLO's random projections (Note [APOLLO], docs/notes/apollo.md): Gaussian matrices that are
// never stored, regenerated from a key on every step. The key is derived from the run's seed,
// the parameter's index in the layout and the projection window (step / gap), so any range of
// the layout (a ZeRO shard, an offloaded block) and any resumed run draws the same matrix. The
// generator is counter-based (SplitMix64 and Box-Muller, in double) so that
// tests/reference/make_apollo_fixture.py reproduces it in a few lines of NumPy.
#pragma once

#include <cstdint>

namespace memfit {

// SplitMix64's output function on x + the golden gamma.
uint64_t splitmix64(uint64_t x);
// The key of parameter `index`'s projection in window `window` (0 for steps 1..gap, ...).
uint64_t apollo_projection_key(uint64_t seed, uint64_t index, uint64_t window);
// out[i] = N(0, 1)[key, i] / sqrt(rank) for i in [0, n): element 2k and 2k + 1 are Box-Muller's
// pair from u1 = ((splitmix64(key + 2k) >> 11) + 1) / 2^53 and u2 = (splitmix64(key + 2k + 1)
// >> 11) / 2^53 (cosine, then sine), rounded once to float.
void apollo_projection_fill(float* out, int64_t n, uint64_t key, int rank);

}  // namespace memfit
