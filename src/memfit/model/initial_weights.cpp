#include "memfit/model/initial_weights.h"

#include <algorithm>
#include <cmath>

#include <omp.h>

#include "memfit/kernels/cpu/parallel.h"
#include "memfit/model/model_family.h"

namespace memfit {

InitialWeights::InitialWeights(const ModelConfig& config, const ParamLayout& layout,
                               uint64_t seed)
    : config_(config), layout_(layout), seed_(seed) {}

// The draw costs tens of nanoseconds an element (two generator steps, a log, a sqrt and a cos),
// so the set-up of a 7B model spent minutes here on one thread (Note [Set-up by range]). Each
// thread draws a contiguous part of the range with its own generator, skipping (discard) to
// the part's position as a range of its own would: every element takes the positions the
// whole walk gives it, so the bits do not depend on the thread count
// (InitialWeights.AnyThreadCountDrawsTheSameBits). Each thread's parts move forward from one
// call to the next (ranges drawn in increasing order), so its discards add up to the other
// threads' parts, a fraction of a nanosecond an element.
void InitialWeights::draw(ElementRange range, float* dst) {
  if (range.empty()) return;
  if (omp_in_parallel()) {  // a caller's thread: its own walk from the seed
    Walk w{std::mt19937_64(seed_), 0};
    draw(range, dst, w);
    return;
  }
  const size_t threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
  while (walks_.size() < threads) walks_.push_back({std::mt19937_64(seed_), 0});
  kernels::parallel_ranges(range.size(), [&](int64_t begin, int64_t end) {
    draw({range.begin + begin, range.begin + end}, dst + begin,
         walks_[static_cast<size_t>(omp_get_thread_num())]);
  });
}

// Note [Initial weights by range]: the draw walks the layout in order, and each drawn element
// takes exactly two draws of the generator (one Box-Muller normal, two uniforms). So element i
// of a parameter whose drawn elements start at generator position P takes positions P + 2i and
// P + 2i + 1, and a range is drawn by discarding up to its first element's position
// (mt19937_64::discard regenerates the state without tempering or the normal's log and cos),
// then drawing as the whole walk would. The values are the whole draw's bit for bit
// (InitialWeights.AnyRangeDrawsTheWholeDrawsBits).
void InitialWeights::draw(ElementRange range, float* dst, Walk& walk) const {
  // Box-Muller over mt19937_64 rather than std::normal_distribution, whose algorithm differs
  // between standard libraries: the same seed gives the same weights everywhere.
  auto uniform = [&] {
    ++walk.at;
    return (static_cast<double>(walk.rng() >> 11) + 0.5) * 0x1.0p-53;
  };
  auto normal = [&] {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
  };
  std::fill(dst, dst + range.size(), 0.0f);
  const double residual_scale = model_family(config_.family).residual_init_scale(config_);
  uint64_t position = 0;  // where the next parameter's draws start in the whole walk
  for (const ParamInfo& p : layout_.params()) {
    const int64_t lo = std::max(range.begin, p.offset) - p.offset;
    const int64_t hi = std::min(range.end, p.offset + p.numel) - p.offset;
    auto w = [&](int64_t i) -> float& { return dst[p.offset + i - range.begin]; };
    switch (p.role) {
      case ParamRole::norm_weight:
        for (int64_t i = lo; i < hi; ++i) w(i) = 1.0f;
        break;
      case ParamRole::norm_bias:
      case ParamRole::linear_bias: break;
      default: {
        double std = 0.02;
        if (p.role == ParamRole::attn_proj_weight || p.role == ParamRole::mlp_proj_weight)
          std *= residual_scale;
        int64_t n = p.numel;
        if (p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head)
          n = int64_t{config_.vocab_size} * p.shape[1];
        const int64_t end = std::min(hi, n);
        if (lo < end) {
          const uint64_t first = position + 2 * static_cast<uint64_t>(lo);
          if (first < walk.at) {  // behind the generator: start the walk again
            walk.rng.seed(seed_);
            walk.at = 0;
          }
          walk.rng.discard(first - walk.at);
          walk.at = first;
          for (int64_t i = lo; i < end; ++i) w(i) = static_cast<float>(std * normal());
        }
        position += 2 * static_cast<uint64_t>(n);
      }
    }
  }
}

void draw_initial_range(const ModelConfig& config, const ParamLayout& layout, uint64_t seed,
                        ElementRange range, float* dst) {
  InitialWeights(config, layout, seed).draw(range, dst);
}

}  // namespace memfit
