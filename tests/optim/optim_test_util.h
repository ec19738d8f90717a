// Shared fixtures for the optimizer tests: small GPT-2 layouts (one with odd sizes so blocks are
// partial), filled parameter and gradient slabs, and a constructor for this branch's optimizers
// that does not go through make_optimizer (which also links AdamW's kernel).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/optimizer_reference.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/adam_mini.h"
#include "memfit/optim/adamw4bit.h"
#include "memfit/optim/adamw8bit.h"
#include "memfit/optim/apollo.h"
#include "memfit/optim/galore.h"
#include "memfit/optim/lion.h"
#include "memfit/optim/lion8bit.h"
#include "memfit/optim/sgd.h"

namespace memfit::testing {

// Width 100 with 4 heads of 25, 50 positions, vocabulary 100 (padded to 128): wpe, c_attn,
// c_proj and c_fc end in partial 256-value blocks; LayerNorms and biases stay under 4096.
inline ModelConfig odd_config() {
  ModelConfig c;
  c.n_layer = 1;
  c.n_head = 4;
  c.d_model = 100;
  c.max_seq_len = 50;
  c.vocab_size = 100;
  c.finalize();
  return c;
}

// A layout with parameter and gradient slabs: parameters N(0, 1), gradients N(0, 0.1); the
// alignment padding between tensors stays zero.
struct Slabs {
  ModelConfig config;
  ParamLayout layout;
  MemoryPool pool;
  Tensor params, grads;

  explicit Slabs(const ModelConfig& c) : config(c), layout(c) {
    params = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "params");
    grads = Tensor::empty(pool, {layout.total()}, DType::f32, Category::grads, "grads");
    fill_params(1);
  }
  void fill_params(uint32_t seed) { fill(params, seed, 1.0f); }
  void fill_grads(uint32_t seed) { fill(grads, seed, 0.1f); }
  std::vector<double> params_copy() const {
    return {params.data<float>(), params.data<float>() + layout.total()};
  }

 private:
  void fill(Tensor& slab, uint32_t seed, float stddev) {
    float* d = slab.data<float>();
    for (const ParamInfo& p : layout.params()) {
      auto v = normal_vector(p.numel, seed + static_cast<uint32_t>(p.offset), stddev);
      std::copy(v.begin(), v.end(), d + p.offset);
    }
  }
};

// This branch's optimizers by name, constructed directly.
inline std::unique_ptr<Optimizer> construct(const OptimConfig& c, const ParamLayout& layout,
                                            MemoryPool& pool) {
  if (c.name == "adamw8bit") return std::make_unique<AdamW8bit>(c, layout, pool);
  if (c.name == "adamw4bit") return std::make_unique<AdamW4bit>(c, layout, pool);
  if (c.name == "lion") return std::make_unique<Lion>(c, layout, pool);
  if (c.name == "lion8bit") return std::make_unique<Lion8bit>(c, layout, pool);
  if (c.name == "adam-mini") return std::make_unique<AdamMini>(c, layout, pool);
  if (c.name == "sgd") return std::make_unique<Sgd>(c, layout, pool);
  if (is_apollo(c.name)) return std::make_unique<Apollo>(c, layout, &pool);
  if (is_galore(c.name)) return std::make_unique<Galore>(c, layout, &pool);
  ADD_FAILURE() << "no optimizer " << c.name;
  return nullptr;
}

inline size_t predicted_state_bytes(const OptimConfig& c, const ParamLayout& layout) {
  if (c.name == "adamw8bit") return AdamW8bit::state_bytes_for(layout);
  if (c.name == "adamw4bit") return AdamW4bit::state_bytes_for(layout);
  if (c.name == "lion") return Lion::state_bytes_for(layout);
  if (c.name == "lion8bit") return Lion8bit::state_bytes_for(layout);
  if (c.name == "adam-mini") return AdamMini::state_bytes_for(layout, c.n_head);
  if (c.name == "sgd") return Sgd::state_bytes_for(layout);
  if (is_apollo(c.name)) {
    // Note [APOLLO]: m and v hold r x max(m, n) per projected matrix and one value per element
    // elsewhere, each parameter's from a 64-byte line; one limiter value per matrix; the scratch
    // is the largest matrix's P, R, 6 x max(m, n) sums and max(m, n) factors.
    auto line = [](int64_t n) { return (n + 15) / 16 * 16; };
    int64_t moments = 0, matrices = 0, scratch = 0;
    for (const ParamInfo& p : layout.params()) {
      moments = line(moments);
      if (!Apollo::projects(p)) {
        moments += p.numel;
        continue;
      }
      const int64_t small = std::min(p.shape[0], p.shape[1]);
      const int64_t large = std::max(p.shape[0], p.shape[1]);
      const int64_t r = std::min<int64_t>(apollo_rank(c), small);
      moments += r * large;
      ++matrices;
      scratch = std::max(scratch,
                         line(r * small) + line(r * large) + line(6 * large) + line(large));
    }
    return (2 * line(moments) + line(matrices) + line(scratch)) * sizeof(float);
  }
  if (is_galore(c.name)) {
    // Note [GaLore]: the moments over r x max(m, n) values per projected matrix and one per
    // element elsewhere, each tensor from a 64-byte line (f32, or 8-bit as adamw8bit's over
    // those tensors); the projector r x min(m, n) per matrix (f32); the scratch the largest
    // matrix's projected gradient (and for galore8bit the zero weights its kernel steps).
    auto line = [](int64_t n) { return (n + 15) / 16 * 16; };
    std::vector<ParamInfo> moments;
    int64_t at = 0, proj = 0, scratch = 0;
    for (const ParamInfo& p : layout.params()) {
      ParamInfo q = p;
      q.offset = at = line(at);
      if (Galore::projects(p)) {
        const int64_t small = std::min(p.shape[0], p.shape[1]);
        const int64_t large = std::max(p.shape[0], p.shape[1]);
        const int64_t r = std::min<int64_t>(galore_rank(c), small);
        q.numel = r * large;
        q.shape = Shape{r, large};
        proj += line(r * small);
        scratch = std::max(scratch, line(r * large) * (c.name == "galore8bit" ? 2 : 1));
      }
      at += q.numel;
      moments.push_back(q);
    }
    const ParamLayout ml(moments, line(at));
    const size_t moment_bytes = c.name == "galore8bit"
                                    ? 2 * QuantizedStateLayout(ml).bytes()
                                    : 2 * size_t(line(at)) * sizeof(float);
    return moment_bytes + (line(proj) + line(scratch)) * sizeof(float);
  }
  ADD_FAILURE() << "no optimizer " << c.name;
  return 0;
}

inline const std::vector<std::string>& branch_optimizers() {
  static const std::vector<std::string> names = {"adamw8bit", "lion",      "lion8bit",
                                                 "adam-mini", "sgd",       "adamw4bit",
                                                 "apollo",    "apollo-mini", "galore",
                                                 "galore8bit"};
  return names;
}

}  // namespace memfit::testing
