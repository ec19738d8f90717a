// Shared by the finite-difference gradient tests (gpt2_gradient_test.cpp,
// llama_gradient_test.cpp): noise on the weights, a random batch held both as tensors for the model and as vectors for
// the double-precision reference, and central differences at sampled entries of one parameter.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit::gradient_test {

// The entries of `p` that are real: all but the token embedding's and head's padding rows.
inline int64_t real_numel(const ModelConfig& c, const ParamInfo& p) {
  const bool padded = p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head;
  return padded ? int64_t{c.vocab_size} * c.d_model : p.numel;
}

// Adds normal(0, 0.05) noise from `rng` to the real entries of every parameter in `params`:
// larger than the inits, so that every path carries a gradient well above rounding.
inline void add_noise(const ModelConfig& c, const ParamLayout& layout, Tensor& params,
                      std::mt19937& rng) {
  std::normal_distribution<float> noise(0.0f, 0.05f);
  for (const ParamInfo& p : layout.params()) {
    float* v = params.data<float>() + p.offset;
    for (int64_t i = 0, n = real_numel(c, p); i < n; ++i) v[i] += noise(rng);
  }
}

// B x T tokens and targets below `vocab`, drawn from `rng` (a token, then its target).
struct RandomBatch {
  Tensor tokens, targets;
  std::vector<int32_t> tok, tgt;
  RandomBatch(MemoryPool& pool, int B, int T, int vocab, std::mt19937& rng)
      : tok(B * T), tgt(B * T) {
    tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens");
    targets = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "targets");
    for (int i = 0; i < B * T; ++i) {
      tokens.data<int32_t>()[i] = tok[i] = static_cast<int32_t>(rng() % vocab);
      targets.data<int32_t>()[i] = tgt[i] = static_cast<int32_t>(rng() % vocab);
    }
  }
};

// Over 6 sampled entries of parameter `p`: the norm of (central difference - analytic gradient)
// and the norm of the central differences.
struct FiniteDifferenceError {
  double diff, norm;
};

// Central differences (step 1e-5) of `loss`, a function of the double weights `w`, at 6 entries
// of `p` among its first `n` (its real rows), against `grads` (memfit's gradient slab). For the
// token embedding, the first 3 samples lie in the rows of the batch's first tokens `tok`, where
// its gradient lives. `w` is restored.
inline FiniteDifferenceError finite_difference_error(const ParamInfo& p, int64_t n, int d_model,
                                                     const std::vector<int32_t>& tok,
                                                     std::vector<double>& w, const float* grads,
                                                     std::mt19937& rng,
                                                     const std::function<double()>& loss) {
  const double eps = 1e-5;
  double diff = 0, norm = 0;
  for (int s = 0; s < 6; ++s) {
    int64_t i = (s < 3 && p.role == ParamRole::token_embedding)
                    ? int64_t{tok[s]} * d_model + int64_t(rng() % d_model)
                    : int64_t(rng() % n);
    double saved = w[p.offset + i];
    w[p.offset + i] = saved + eps;
    double up = loss();
    w[p.offset + i] = saved - eps;
    double down = loss();
    w[p.offset + i] = saved;
    double fd = (up - down) / (2 * eps);
    double analytic = grads[p.offset + i];
    diff += (fd - analytic) * (fd - analytic);
    norm += fd * fd;
  }
  return {std::sqrt(diff), std::sqrt(norm)};
}

}  // namespace memfit::gradient_test
