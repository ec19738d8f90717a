#include "memfit/model/initial_weights.h"

#include <algorithm>
#include <cmath>

namespace memfit {

InitialWeights::InitialWeights(const ModelConfig& config, const ParamLayout& layout,
                               uint64_t seed)
    : config_(config), layout_(layout), seed_(seed), rng_(seed) {}

// Note [Initial weights by range]: the draw walks the layout in order, and each drawn element
// takes exactly two draws of the generator (one Box-Muller normal, two uniforms). So element i
// of a parameter whose drawn elements start at generator position P takes positions P + 2i and
// P + 2i + 1, and a range is drawn by discarding up to its first element's position
// (mt19937_64::discard regenerates the state without tempering or the normal's log and cos),
// then drawing as the whole walk would. The values are the whole draw's bit for bit
// (InitialWeights.AnyRangeDrawsTheWholeDrawsBits).
void InitialWeights::draw(ElementRange range, float* dst) {
  // Box-Muller over mt19937_64 rather than std::normal_distribution, whose algorithm differs
  // between standard libraries: the same seed gives the same weights everywhere.
  auto uniform = [&] {
    ++at_;
    return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53;
  };
  auto normal = [&] {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
  };
  std::fill(dst, dst + range.size(), 0.0f);
  const double residual_scale =
      config_.gpt2() ? 1.0 / std::sqrt(2.0 * config_.n_layer) : 1.0;
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
          if (first < at_) {  // behind the generator: start the walk again
            rng_.seed(seed_);
            at_ = 0;
          }
          rng_.discard(first - at_);
          at_ = first;
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
