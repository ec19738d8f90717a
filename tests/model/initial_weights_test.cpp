// The initial weights drawn by range (model/initial_weights.h, Transformer::set_weights): every
// range, piece size, precision and shard gets the bits of the whole layout drawn at once, as
// init_weights drew it before the draw went by range (the reference below is that code).
#include "memfit/model/initial_weights.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <random>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/model/transformer.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

// The whole-layout draw as init_slab wrote it: one walk of the generator over the layout.
std::vector<float> whole_draw(const ModelConfig& config, const ParamLayout& layout,
                              uint64_t seed) {
  std::vector<float> slab(static_cast<size_t>(layout.total()), 0.0f);
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  auto normal = [&] {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
  };
  const double residual_scale =
      config.family == Family::gpt2 ? 1.0 / std::sqrt(2.0 * config.n_layer) : 1.0;
  for (const ParamInfo& p : layout.params()) {
    float* w = slab.data() + p.offset;
    switch (p.role) {
      case ParamRole::norm_weight: std::fill(w, w + p.numel, 1.0f); break;
      case ParamRole::norm_bias:
      case ParamRole::linear_bias: break;
      default: {
        double std = 0.02;
        if (p.role == ParamRole::attn_proj_weight || p.role == ParamRole::mlp_proj_weight)
          std *= residual_scale;
        int64_t n = p.numel;
        if (p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head)
          n = int64_t{config.vocab_size} * p.shape[1];
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(std * normal());
      }
    }
  }
  return slab;
}

std::vector<ModelConfig> configs() {
  ModelConfig untied = ModelConfig::preset("llama-tiny");
  untied.tie_embeddings = false;  // an lm_head drawn after the blocks
  std::vector<ModelConfig> cs = {gpt2_test::odd_config(), gpt2_test::odd_config(Family::llama),
                                 ModelConfig::preset("gpt2-tiny"), untied};
  for (ModelConfig& c : cs) c.finalize();
  return cs;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(InitialWeights, AnyRangeDrawsTheWholeDrawsBits) {
  std::mt19937 cut(3);
  for (const ModelConfig& c : configs()) {
    const ParamLayout layout(c);
    const std::vector<float> whole = whole_draw(c, layout, 42);
    // Some elements are drawn, some are 1 (norm gains): the comparison covers both.
    ASSERT_NE(whole[static_cast<size_t>(layout.params()[0].offset)], 0.0f);
    std::vector<float> got(whole.size(), -7.0f);
    draw_initial_range(c, layout, 42, {0, layout.total()}, got.data());
    EXPECT_TRUE(same_bits(got.data(), whole.data(), layout.total())) << c.describe();
    // Random cuts, drawn in increasing order with one generator, then in decreasing order
    // (each earlier range restarts the walk), and single elements at the ends.
    std::vector<int64_t> at = {0, layout.total()};
    for (int k = 0; k < 9; ++k)
      at.push_back(std::uniform_int_distribution<int64_t>(0, layout.total())(cut));
    at.push_back(1);
    at.push_back(layout.total() - 1);
    std::sort(at.begin(), at.end());
    std::fill(got.begin(), got.end(), -7.0f);
    InitialWeights up(c, layout, 42);
    for (size_t i = 0; i + 1 < at.size(); ++i) up.draw({at[i], at[i + 1]}, got.data() + at[i]);
    EXPECT_TRUE(same_bits(got.data(), whole.data(), layout.total())) << c.describe();
    std::fill(got.begin(), got.end(), -7.0f);
    InitialWeights down(c, layout, 42);
    for (size_t i = at.size() - 1; i > 0; --i)
      down.draw({at[i - 1], at[i]}, got.data() + at[i - 1]);
    EXPECT_TRUE(same_bits(got.data(), whole.data(), layout.total())) << c.describe();
    // Another seed, other bits.
    draw_initial_range(c, layout, 43, {0, layout.total()}, got.data());
    EXPECT_FALSE(same_bits(got.data(), whole.data(), layout.total()));
  }
}

// The draw goes by thread (each thread a contiguous part with its own generator, skipping to
// it): the whole draw's bits with any team size, for the whole layout and for pieces drawn in
// increasing order by one InitialWeights (each thread's generator moving forward), and drawn
// from inside a parallel region (each caller its own walk).
TEST(InitialWeights, AnyThreadCountDrawsTheSameBits) {
  const int before = omp_get_max_threads();
  int large = 0;  // the presets: large enough to be drawn in parts (the odd ones are not)
  for (const ModelConfig& c : configs()) {
    const ParamLayout layout(c);
    if (layout.total() <= 4 * kernels::kParallelGrain) continue;
    ++large;
    const std::vector<float> whole = whole_draw(c, layout, 7);
    for (int threads : {1, 2, 3, 5}) {
      SCOPED_TRACE(threads);
      omp_set_num_threads(threads);
      std::vector<float> got(whole.size(), -7.0f);
      draw_initial_range(c, layout, 7, {0, layout.total()}, got.data());
      EXPECT_TRUE(same_bits(got.data(), whole.data(), layout.total())) << c.describe();
      std::fill(got.begin(), got.end(), -7.0f);
      InitialWeights pieces(c, layout, 7);
      const int64_t piece = layout.total() / 3 + 17;
      for (int64_t a = 0; a < layout.total(); a += piece) {
        const int64_t b = std::min(layout.total(), a + piece);
        pieces.draw({a, b}, got.data() + a);
      }
      EXPECT_TRUE(same_bits(got.data(), whole.data(), layout.total())) << c.describe();
    }
    omp_set_num_threads(2);
    std::vector<float> got(whole.size(), -7.0f);
    const int64_t half = layout.total() / 2;
#pragma omp parallel num_threads(2)
    {
      const int64_t a = omp_get_thread_num() == 0 ? 0 : half;
      const int64_t b = omp_get_thread_num() == 0 ? half : layout.total();
      draw_initial_range(c, layout, 7, {a, b}, got.data() + a);
    }
    EXPECT_TRUE(same_bits(got.data(), whole.data(), layout.total())) << c.describe();
  }
  omp_set_num_threads(before);
  EXPECT_EQ(large, 2);
}

// The working copy's bits: the whole draw rounded (or copied) into its type.
std::vector<uint16_t> rounded(const std::vector<float>& w, DType dt) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i)
    out[i] = dt == DType::bf16 ? bf16_from_f32(w[i]) : f16_from_f32(w[i]);
  return out;
}

void expect_working(const Transformer& gpt_in, const std::vector<float>& whole, ElementRange r) {
  Transformer& gpt = const_cast<Transformer&>(gpt_in);
  const Tensor& p = gpt.params();
  const int64_t off = gpt.params_range().begin;
  ASSERT_EQ(p.numel(), gpt.params_range().size());
  if (p.dtype() == DType::f32) {
    EXPECT_TRUE(same_bits(p.data<float>() + (r.begin - off), whole.data() + r.begin, r.size()));
    return;
  }
  const std::vector<uint16_t> want = rounded(whole, p.dtype());
  EXPECT_EQ(std::memcmp(static_cast<const uint16_t*>(p.raw_data()) + (r.begin - off),
                        want.data() + r.begin, static_cast<size_t>(r.size()) * 2),
            0);
}

TEST(InitialWeights, InitWeightsByPiecesGivesTheWholeDrawsBitsEveryPrecisionAndShard) {
  for (const ModelConfig& c : configs()) {
    const ParamLayout layout(c);
    const std::vector<float> whole = whole_draw(c, layout, 5);
    const ElementRange all{0, layout.total()};
    const ElementRange shard{layout.total() / 3, 2 * layout.total() / 3 + 1};
    for (int64_t piece : {int64_t{1} << 20, int64_t{1000}, int64_t{7}}) {
      for (PrecisionOptions prec : {PrecisionOptions{Precision::fp32, true},
                                    PrecisionOptions{Precision::bf16, true},
                                    PrecisionOptions{Precision::bf16, false},
                                    PrecisionOptions{Precision::fp16, true}}) {
        for (std::optional<ElementRange> range : {std::optional<ElementRange>{},
                                                  std::optional<ElementRange>{shard}}) {
          if (range && !(prec.precision != Precision::fp32 && prec.master_weights)) continue;
          SCOPED_TRACE(c.describe() + " piece " + std::to_string(piece) + " " +
                       std::string(precision_name(prec.precision)) + (prec.master_weights ? "" : " pure") +
                       (range ? " shard" : ""));
          MemoryPool pool;
          Transformer gpt(c, pool, prec, ModelState::master_shard(range));
          gpt.init_weights(5, piece);
          const ElementRange rec = gpt.weights_range();
          if (gpt.weights().dtype() == DType::f32) {
            EXPECT_TRUE(same_bits(gpt.weights().data<float>(), whole.data() + rec.begin,
                                  rec.size()));
          }
          expect_working(gpt, whole, all);
          // Nothing of the set-up is left, and it never held more than one piece beside the
          // model's slabs.
          EXPECT_EQ(pool.bytes_current(Category::staging), 0u);
          EXPECT_LE(pool.bytes_peak(Category::staging),
                    MemoryPool::round_up(static_cast<size_t>(piece) * sizeof(float)));
        }
      }
      // Offloaded master weights (master_in_ram false): the caller's sink gets the shard's
      // values a unit at a time, the working copy is rounded on the way.
      MemoryPool pool;
      Transformer gpt(c, pool, {Precision::bf16, true},
                      ModelState::master_shard(shard, /*in_ram=*/false));
      std::vector<float> file(static_cast<size_t>(shard.size()), -7.0f);
      int64_t next = shard.begin;
      gpt.init_weights(5, piece, [&](const Transformer::RangeFill& fill) {
        for (int64_t a = shard.begin; a < shard.end; a += 333) {
          const int64_t b = std::min(shard.end, a + 333);
          EXPECT_EQ(a, next);
          fill(a, b, file.data() + (a - shard.begin));
          next = b;
        }
      });
      EXPECT_EQ(next, shard.end);
      EXPECT_TRUE(same_bits(file.data(), whole.data() + shard.begin, shard.size()));
      expect_working(gpt, whole, all);
    }
  }
}

}  // namespace
}  // namespace memfit
