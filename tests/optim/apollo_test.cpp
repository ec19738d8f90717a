// APOLLO and APOLLO-Mini (optim/apollo.h): three steps against PyTorch's (the paper's code on the
// projected matrices, torch.optim.AdamW elsewhere; tests/reference/make_apollo_fixture.py), the
// projection generator against its definition, the cuts the per-matrix state allows, and the
// settings that are refused.
#include "memfit/optim/apollo.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/optim/apollo_projection.h"
#include "memfit/state/shard.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

const char* kFixture = MEMFIT_SOURCE_DIR "/tests/reference/apollo_fixture.safetensors";

class ApolloReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ApolloReference, ThreeStepsMatchPyTorch) {
  const io::SafetensorsReader file(kFixture);
  auto meta = [&](const char* key) { return std::stod(file.metadata().at(key)); };
  ModelConfig mc;
  mc.n_layer = int(meta("n_layer"));
  mc.n_head = int(meta("n_head"));
  mc.d_model = int(meta("d_model"));
  mc.max_seq_len = int(meta("max_seq_len"));
  mc.vocab_size = int(meta("vocab_size"));
  mc.finalize();
  testing::Slabs s(mc);
  OptimConfig c;
  c.name = GetParam();
  c.beta1 = float(meta("beta1"));
  c.beta2 = float(meta("beta2"));
  c.eps = float(meta("eps"));
  c.weight_decay = float(meta("weight_decay"));
  c.seed = uint64_t(meta("seed"));
  c.proj_gap = int(meta("proj_gap"));
  if (c.name == "apollo") c.rank = int(meta("apollo_rank"));
  const float lr = float(meta("lr")), grad_scale = float(meta("grad_scale"));
  Apollo opt(c, s.layout, &s.pool);
  auto at = [&](Tensor& slab, const ParamInfo& p) { return slab.view(p.offset, p.shape); };
  for (const ParamInfo& p : s.layout.params()) file.read("w0." + p.name, at(s.params, p));
  MemoryPool scratch_pool;
  for (int t = 1; t <= int(meta("steps")); ++t) {
    for (const ParamInfo& p : s.layout.params())
      file.read("g" + std::to_string(t - 1) + "." + p.name, at(s.grads, p));
    opt.step(s.params, s.grads, lr, grad_scale);
    for (const ParamInfo& p : s.layout.params()) {
      Tensor want = Tensor::empty(scratch_pool, p.shape, DType::f32, Category::staging, "want");
      file.read(c.name + ".w" + std::to_string(t) + "." + p.name, want);
      const float* got = at(s.params, p).data<float>();
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < p.numel; ++i) {
        const double d = double(got[i]) - want.data<float>()[i];
        diff += d * d;
        norm += double(want.data<float>()[i]) * want.data<float>()[i];
      }
      EXPECT_LT(std::sqrt(diff / norm), 1e-5) << p.name << " after step " << t;
      // The step moved every parameter (the comparison is not against the initial weights).
      if (t == 1) {
        Tensor w0 = Tensor::empty(scratch_pool, p.shape, DType::f32, Category::staging, "w0");
        file.read("w0." + p.name, w0);
        EXPECT_NE(std::memcmp(w0.raw_data(), got, w0.nbytes()), 0) << p.name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Both, ApolloReference, ::testing::Values("apollo", "apollo-mini"),
                         [](const auto& info) {
                           return info.param == "apollo" ? std::string("apollo")
                                                         : std::string("apollo_mini");
                         });

TEST(ApolloProjection, IsBoxMullerOnSplitMix64Counters) {
  std::vector<float> p(7);
  const uint64_t key = apollo_projection_key(7, 4, 0);
  apollo_projection_fill(p.data(), 7, key, 4);
  for (int k = 0; k < 4; ++k) {
    const double u1 = double((splitmix64(key + 2 * k) >> 11) + 1) * 0x1p-53;
    const double u2 = double(splitmix64(key + 2 * k + 1) >> 11) * 0x1p-53;
    const double r = std::sqrt(-2 * std::log(u1)), a = 2 * std::numbers::pi * u2;
    EXPECT_FLOAT_EQ(p[2 * k], float(r * std::cos(a) / 2));
    if (2 * k + 1 < 7) {
      EXPECT_FLOAT_EQ(p[2 * k + 1], float(r * std::sin(a) / 2));
    }
  }
  // Another window, another parameter, another run seed: another matrix.
  EXPECT_NE(key, apollo_projection_key(7, 4, 1));
  EXPECT_NE(key, apollo_projection_key(7, 5, 0));
  EXPECT_NE(key, apollo_projection_key(8, 4, 0));
  // Gaussian with variance 1 / rank over many draws.
  std::vector<float> big(1 << 16);
  apollo_projection_fill(big.data(), int64_t(big.size()), key, 4);
  double mean = 0, sq = 0;
  for (float x : big) mean += x, sq += double(x) * x;
  mean /= big.size();
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sq / big.size(), 0.25, 0.01);
}

TEST(Apollo, ProjectedMatricesAreCutOnlyAtTheirEdges) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig mc = ModelConfig::preset(preset);
    mc.finalize();
    const ParamLayout layout(mc);
    OptimConfig c;
    c.name = "apollo-mini";
    Apollo opt(c, layout, nullptr);
    int projected = 0;
    for (const ParamInfo& p : layout.params()) {
      if (!Apollo::projects(p)) continue;
      ++projected;
      EXPECT_EQ(opt.next_cut(p.offset), p.offset) << p.name;
      const int64_t inside = opt.next_cut(p.offset + 1);
      EXPECT_GE(inside, p.offset + p.numel) << p.name;
      EXPECT_EQ(opt.next_cut(inside), inside) << p.name;
    }
    EXPECT_EQ(projected, mc.n_layer * (mc.family == Family::llama ? 7 : 4)) << preset;
    // Shards over many ranks hold whole matrices.
    for (const ElementRange& r : shard_ranges(layout, c, 7)) {
      for (const ParamInfo& p : layout.params()) {
        if (Apollo::projects(p)) {
          EXPECT_FALSE(r.begin > p.offset && r.begin < p.offset + p.numel) << p.name;
        }
      }
    }
    EXPECT_THROW(Apollo(c, layout, nullptr,
                        ElementRange{0, layout.params()[4].offset + 16}),
                 Error);
  }
}

TEST(Apollo, RankIsCappedAndMiniKeepsAlmostNoState) {
  const ParamLayout layout(ModelConfig::preset("gpt2-tiny"));  // width 96
  const ParamInfo& fc = *std::find_if(layout.params().begin(), layout.params().end(),
                                      [](const ParamInfo& p) { return p.role == ParamRole::mlp_fc_weight; });
  OptimConfig c;
  c.name = "apollo";
  EXPECT_EQ(Apollo::rank_for(c, fc), 96);  // 256 capped at the smaller side
  c.rank = 8;
  EXPECT_EQ(Apollo::rank_for(c, fc), 8);
  c.name = "apollo-mini";
  c.rank = 0;
  EXPECT_EQ(Apollo::rank_for(c, fc), 1);
}

TEST(Apollo, BadSettingsAreConfigErrors) {
  const ParamLayout layout(ModelConfig::preset("gpt2-tiny"));
  auto refused = [&](const OptimConfig& c, const char* words) {
    try {
      Apollo opt(c, layout, nullptr);
      ADD_FAILURE() << "expected a ConfigError mentioning " << words;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  OptimConfig c;
  c.name = "apollo";
  c.rank = -1;
  refused(c, "--optim-rank must be >= 1");
  c.rank = 4;
  c.proj_gap = 0;
  refused(c, "--optim-proj-gap must be >= 1");
  c.proj_gap = 200;
  c.eps = 0;
  refused(c, "eps must be positive");
  OptimConfig other;
  other.name = "adamw";
  other.rank = 4;
  EXPECT_THROW(check_optim_config(other), ConfigError);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// The per-channel sums are split over the OpenMP team by channel (channels are rows for c_attn
// and c_fc, columns for mlp.c_proj; width 256 so that the matrices are large enough for the
// team): one thread or several give the same step up to the projection GEMM's rounding, which
// is oneDNN's and may split its sums by thread (as every matmul of the engine; it does under
// MEMFIT_MAX_ISA=avx2): 1e-6 of the weights' scale, far below one step's change.
TEST(Apollo, TheStepDoesNotDependOnTheThreadCountBeyondTheGemm) {
  const int threads = omp_get_max_threads();
  ModelConfig mc;
  mc.n_layer = 1;
  mc.n_head = 4;
  mc.d_model = 256;
  mc.max_seq_len = 16;
  mc.vocab_size = 64;
  mc.finalize();
  for (const char* name : {"apollo", "apollo-mini"}) {
    SCOPED_TRACE(name);
    OptimConfig c;
    c.name = name;
    c.rank = std::string(name) == "apollo" ? 24 : 0;
    testing::Slabs a(mc), b(mc);
    Apollo oa(c, a.layout, &a.pool), ob(c, b.layout, &b.pool);
    for (int t = 0; t < 2; ++t) {
      a.fill_grads(40 + t);
      b.fill_grads(40 + t);
      omp_set_num_threads(1);
      oa.step(a.params, a.grads, 1e-2f, 1.0f);
      omp_set_num_threads(std::max(3, threads));
      ob.step(b.params, b.grads, 1e-2f, 1.0f);
    }
    omp_set_num_threads(threads);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < a.layout.total(); ++i) {
      const double x = a.params.data<float>()[i], y = b.params.data<float>()[i];
      diff = std::max(diff, std::abs(x - y));
      norm = std::max(norm, std::abs(x));
    }
    EXPECT_LE(diff, 1e-6 * norm);
  }
}

}  // namespace
}  // namespace memfit
