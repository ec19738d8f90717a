// GaLore and GaLore-8bit (optim/galore.h): four steps against PyTorch's (the authors' code on the
// projected matrices, torch.linalg.svd with a new projector at step 3, torch.optim.AdamW
// elsewhere; tests/reference/make_galore_fixture.py), the projector against matrices whose SVD
// is known, galore8bit beside galore, the cuts the per-matrix state allows, and the settings
// that are refused.
#include "memfit/optim/galore.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/optim/galore_projector.h"
#include "memfit/state/shard.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

const char* kFixture = MEMFIT_SOURCE_DIR "/tests/reference/galore_fixture.safetensors";

// Relative L2 distance of a parameter's values from the fixture's.
double relative_diff(const float* got, const Tensor& want) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = double(got[i]) - want.data<float>()[i];
    diff += d * d;
    norm += double(want.data<float>()[i]) * want.data<float>()[i];
  }
  return std::sqrt(diff / norm);
}

// Steps `name` through the fixture's gradients; after each step f(t, param, relative diff).
void run_fixture(const std::string& name,
                 const std::function<void(int, const ParamInfo&, double)>& f) {
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
  c.name = name;
  c.beta1 = float(meta("beta1"));
  c.beta2 = float(meta("beta2"));
  c.eps = float(meta("eps"));
  c.weight_decay = float(meta("weight_decay"));
  c.proj_gap = int(meta("proj_gap"));
  c.rank = int(meta("galore_rank"));
  ASSERT_EQ(float(meta("scale")), Galore::kScale);
  const float lr = float(meta("lr")), grad_scale = float(meta("grad_scale"));
  Galore opt(c, s.layout, &s.pool);
  auto at = [&](Tensor& slab, const ParamInfo& p) { return slab.view(p.offset, p.shape); };
  for (const ParamInfo& p : s.layout.params()) file.read("w0." + p.name, at(s.params, p));
  MemoryPool scratch_pool;
  for (int t = 1; t <= int(meta("steps")); ++t) {
    for (const ParamInfo& p : s.layout.params())
      file.read("g" + std::to_string(t - 1) + "." + p.name, at(s.grads, p));
    opt.step(s.params, s.grads, lr, grad_scale);
    for (const ParamInfo& p : s.layout.params()) {
      Tensor want = Tensor::empty(scratch_pool, p.shape, DType::f32, Category::staging, "want");
      file.read("galore.w" + std::to_string(t) + "." + p.name, want);
      const float* got = at(s.params, p).data<float>();
      f(t, p, relative_diff(got, want));
      if (t == 1) {  // the step moved every parameter
        Tensor w0 = Tensor::empty(scratch_pool, p.shape, DType::f32, Category::staging, "w0");
        file.read("w0." + p.name, w0);
        EXPECT_NE(std::memcmp(w0.raw_data(), got, w0.nbytes()), 0) << p.name;
      }
    }
  }
}

TEST(GaloreReference, FourStepsWithANewProjectorMatchPyTorch) {
  run_fixture("galore", [](int t, const ParamInfo& p, double diff) {
    EXPECT_LT(diff, 1e-5) << p.name << " after step " << t;
  });
}

// galore8bit on the same steps: every tensor of this tiny layout is under 4096 values, so its
// moments stay f32 (as bitsandbytes' min_8bit_size) and only the 8-bit kernel's arithmetic
// differs from torch.optim.AdamW's (eps beside the bias corrections): within 1e-4.
TEST(GaloreReference, Galore8bitOnSmallTensorsIsCloseToPyTorch) {
  run_fixture("galore8bit", [](int t, const ParamInfo& p, double diff) {
    EXPECT_LT(diff, 1e-4) << p.name << " after step " << t;
  });
}

// G = sum_k s_k e_{a_k} e_{b_k}^T: its singular vectors are basis vectors, so the projector is
// known exactly, signs included (the entry of largest magnitude positive, whatever s_k's sign).
TEST(GaloreProjector, FindsTheTopSingularVectorsWithCanonicalSigns) {
  for (const bool wide : {false, true}) {
    SCOPED_TRACE(wide ? "rows (m < n)" : "columns (m >= n)");
    const int64_t m = wide ? 5 : 9, n = wide ? 9 : 5, r = 3;
    std::vector<float> g(m * n, 0.0f);
    // s: -7 at (0, 3), 5 at (2, 1), -3 at (4, 4), 1 at (1, 0): singular values 7, 5, 3, 1.
    const int64_t rows[] = {0, 2, 4, 1}, cols[] = {3, 1, 4, 0};
    const float s[] = {-7, 5, -3, 1};
    for (int k = 0; k < 4; ++k) {
      const int64_t i = wide ? rows[k] : cols[k], j = wide ? cols[k] : rows[k];
      g[i * n + j] = s[k];
    }
    std::vector<float> p(r * std::min(m, n), -1.0f);
    galore_projector(g.data(), m, n, r, p.data());
    // The small side's index of singular vector k: the row (m < n) or column (m >= n).
    for (int64_t k = 0; k < r; ++k) {
      for (int64_t i = 0; i < std::min(m, n); ++i) {
        const float want = i == rows[k] ? 1.0f : 0.0f;
        const float got = wide ? p[i * r + k] : p[k * n + i];
        EXPECT_NEAR(got, want, 1e-6) << "vector " << k << ", entry " << i;
      }
    }
  }
}

TEST(GaloreProjector, IsOrthonormalAndTheSameOnEveryThreadCount) {
  const int64_t m = 96, n = 200, r = 16;
  std::vector<float> g(m * n);
  const auto v = testing::normal_vector(m * n, 3, 1.0f);
  std::copy(v.begin(), v.end(), g.begin());
  std::vector<float> a(m * r), b(m * r);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  galore_projector(g.data(), m, n, r, a.data());
  omp_set_num_threads(std::max(3, threads));
  galore_projector(g.data(), m, n, r, b.data());
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  for (int64_t k = 0; k < r; ++k) {
    for (int64_t l = 0; l < r; ++l) {
      double dot = 0;
      for (int64_t i = 0; i < m; ++i) dot += double(a[i * r + k]) * a[i * r + l];
      EXPECT_NEAR(dot, k == l ? 1.0 : 0.0, 1e-6) << k << ", " << l;
    }
  }
  // The rank-r projection keeps more of G than any other r columns would: at least the share of
  // r / m a random subspace keeps on average.
  double kept = 0, total = 0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t k = 0; k < r; ++k) {
      double x = 0;
      for (int64_t i = 0; i < m; ++i) x += double(a[i * r + k]) * g[i * n + j];
      kept += x * x;
    }
    for (int64_t i = 0; i < m; ++i) total += double(g[i * n + j]) * g[i * n + j];
  }
  EXPECT_GT(kept / total, 1.5 * double(r) / double(m));
}

// Width 256 with rank 32: the projected moments are r x max(m, n) >= 4096 values, so galore8bit
// quantises them; its projector is galore's bit for bit (the same SVD of the same gradient) and
// its parameters stay within the 8-bit moments' error of galore's update.
TEST(Galore8bit, QuantisesTheProjectedMomentsAndStaysCloseToGalore) {
  ModelConfig mc;
  mc.n_layer = 1;
  mc.n_head = 4;
  mc.d_model = 256;
  mc.max_seq_len = 16;
  mc.vocab_size = 64;
  mc.finalize();
  testing::Slabs a(mc), b(mc);
  const std::vector<double> w0 = a.params_copy();
  OptimConfig c;
  c.rank = 32;
  c.name = "galore";
  Galore full(c, a.layout, &a.pool);
  c.name = "galore8bit";
  Galore q8(c, b.layout, &b.pool);
  for (int t = 0; t < 3; ++t) {
    a.fill_grads(20 + t);
    b.fill_grads(20 + t);
    full.step(a.params, a.grads, 1e-2f, 1.0f);
    q8.step(b.params, b.grads, 1e-2f, 1.0f);
  }
  auto state = [](const Optimizer& o, const std::string& name) {
    for (auto& [n, t] : o.state())
      if (n == name) return t;
    ADD_FAILURE() << "no state " << name;
    return Tensor{};
  };
  const Tensor pa = state(full, "proj"), pb = state(q8, "proj");
  ASSERT_EQ(pa.nbytes(), pb.nbytes());
  EXPECT_EQ(std::memcmp(pa.raw_data(), pb.raw_data(), pa.nbytes()), 0);
  EXPECT_GT(state(q8, "m.codes").numel(), 0);
  for (const ParamInfo& p : a.layout.params()) {
    if (!Galore::projects(p)) continue;
    double diff = 0, moved = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      const double x = a.params.data<float>()[i], y = b.params.data<float>()[i];
      diff += (x - y) * (x - y);
      moved += (x - w0[i]) * (x - w0[i]);
    }
    EXPECT_GT(diff, 0.0) << p.name;  // quantised: not the f32 update
    EXPECT_LT(std::sqrt(diff / moved), 0.05) << p.name;
  }
}

TEST(Galore, ProjectedMatricesAreCutOnlyAtTheirEdges) {
  for (const char* name : {"galore", "galore8bit"}) {
    for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
      SCOPED_TRACE(::testing::Message() << name << " " << preset);
      ModelConfig mc = ModelConfig::preset(preset);
      mc.finalize();
      const ParamLayout layout(mc);
      OptimConfig c;
      c.name = name;
      Galore opt(c, layout, nullptr);
      int projected = 0;
      for (const ParamInfo& p : layout.params()) {
        if (!Galore::projects(p)) continue;
        ++projected;
        EXPECT_EQ(opt.next_cut(p.offset), p.offset) << p.name;
        const int64_t inside = opt.next_cut(p.offset + 1);
        EXPECT_GE(inside, p.offset + p.numel) << p.name;
        EXPECT_EQ(opt.next_cut(inside), inside) << p.name;
      }
      EXPECT_EQ(projected, mc.n_layer * (mc.family == Family::llama ? 7 : 4));
      for (const ElementRange& r : shard_ranges(layout, c, 7))
        for (const ParamInfo& p : layout.params())
          if (Galore::projects(p)) {
            EXPECT_FALSE(r.begin > p.offset && r.begin < p.offset + p.numel) << p.name;
          }
      EXPECT_THROW(Galore(c, layout, nullptr, ElementRange{0, layout.params()[4].offset + 16}),
                   Error);
    }
  }
}

TEST(Galore, RankIsCappedAndTheProjectorIsState) {
  const ParamLayout layout(ModelConfig::preset("gpt2-tiny"));  // width 96
  const ParamInfo& fc = *std::find_if(layout.params().begin(), layout.params().end(), [](const ParamInfo& p) {
    return p.role == ParamRole::mlp_fc_weight;
  });
  OptimConfig c;
  c.name = "galore";
  EXPECT_EQ(Galore::rank_for(c, fc), 96);  // 128 capped at the smaller side
  c.rank = 8;
  EXPECT_EQ(Galore::rank_for(c, fc), 8);
  Galore opt(c, layout, nullptr);
  int64_t proj = 0;
  for (const ParamInfo& p : layout.params())
    if (Galore::projects(p)) proj += (8 * std::min(p.shape[0], p.shape[1]) + 15) / 16 * 16;
  ASSERT_EQ(opt.whole_state_specs().back().name, "proj");
  EXPECT_EQ(opt.whole_state_specs().back().numel, proj);
  EXPECT_EQ(opt.whole_state_specs().back().dtype, DType::f32);
}

TEST(Galore, BadSettingsAreConfigErrors) {
  const ParamLayout layout(ModelConfig::preset("gpt2-tiny"));
  auto refused = [&](const OptimConfig& c, const char* words) {
    try {
      Galore opt(c, layout, nullptr);
      ADD_FAILURE() << "expected a ConfigError mentioning " << words;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  OptimConfig c;
  c.name = "galore8bit";
  c.rank = -1;
  refused(c, "--optim-rank must be >= 1 (or 0 for the default, 128)");
  c.rank = 4;
  c.proj_gap = 0;
  refused(c, "--optim-proj-gap must be >= 1");
  c.proj_gap = 200;
  c.eps = 0;
  refused(c, "eps must be positive");
  c.eps = 1e-8f;
  c.state_dtype = DType::bf16;
  refused(c, "already quantised");
}

// A new projector every other step, one thread or several: the SVD is single-threaded and the
// moment loops element-wise, so only the GEMMs' rounding (oneDNN's, split by thread under
// MEMFIT_MAX_ISA=avx2) may differ: 1e-6 of the weights' scale.
TEST(Galore, TheStepDoesNotDependOnTheThreadCountBeyondTheGemm) {
  const int threads = omp_get_max_threads();
  ModelConfig mc;
  mc.n_layer = 1;
  mc.n_head = 4;
  mc.d_model = 256;
  mc.max_seq_len = 16;
  mc.vocab_size = 64;
  mc.finalize();
  for (const char* name : {"galore", "galore8bit"}) {
    SCOPED_TRACE(name);
    OptimConfig c;
    c.name = name;
    c.rank = 24;
    c.proj_gap = 2;
    testing::Slabs a(mc), b(mc);
    Galore oa(c, a.layout, &a.pool), ob(c, b.layout, &b.pool);
    for (int t = 0; t < 3; ++t) {
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
