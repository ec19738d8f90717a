// Stored FP8 weights over shards of the master weights (model/fp8_shard.h; Note [FP8],
// "Storage", "Over ranks"), in one process: three models that own shards of the master
// weights, cut inside matrices and parameters, set up the whole working copy alone
// (init_weights: fp8_weights_fill), and after an update agree on each matrix's amax (the max of
// their parts'), encode their shards and take the others' bytes from their owners (copied here;
// dist/zero/fp8_publish.h gathers them, tests/dist/fp8_publish_test.cpp): the slab, the scales
// and the codes of one process holding the whole master weights, byte for byte, on both
// families; the combination keeps a NaN.
#include "memfit/model/fp8_shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "memfit/model/transformer.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

using namespace gpt2_test;

ModelState stored(std::optional<ElementRange> master = std::nullopt) {
  ModelState s = ModelState::master_shard(master);
  s.params_fp8 = true;
  return s;
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const auto* b = static_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(b, b + t.nbytes());
}

class Fp8Shard : public ::testing::TestWithParam<Family> {};

TEST_P(Fp8Shard, ShardsAgreeOnTheScalesAndGiveTheWholeRefreshsBytes) {
  const ModelConfig c = odd_config(GetParam());
  MemoryPool pool;
  Transformer whole(c, pool, {Precision::fp8, true}, stored());
  const ParamLayout& layout = whole.layout();
  const int64_t n = layout.total();
  const std::vector<ElementRange> shards = {
      {0, n / 3 / 16 * 16}, {n / 3 / 16 * 16, 2 * n / 3 / 16 * 16}, {2 * n / 3 / 16 * 16, n}};
  const Fp8WeightLayout& L = *whole.fp8_weights();
  int cut = 0;
  for (const Fp8Matrix& m : L.matrices())
    for (const ElementRange& s : shards)
      cut += s.begin > m.layout_offset && s.begin < m.layout_offset + m.rows * m.cols;
  ASSERT_GT(cut, 0) << "no shard boundary inside a matrix";
  std::vector<std::unique_ptr<MemoryPool>> pools;
  std::vector<std::unique_ptr<Transformer>> ranks;
  for (const ElementRange& s : shards) {
    pools.push_back(std::make_unique<MemoryPool>());
    ranks.push_back(std::make_unique<Transformer>(
        c, *pools.back(), PrecisionOptions{Precision::fp8, true}, stored(s)));
  }
  // The set-up: each rank's whole working copy is the whole model's (its own reads of every
  // matrix, piece by piece: the piece smaller than a matrix).
  whole.init_weights(21);
  for (auto& r : ranks) {
    r->init_weights(21, 100);
    EXPECT_EQ(bytes(r->fp8_buffer()), bytes(whole.fp8_buffer()));
    EXPECT_EQ(bytes(r->params()), bytes(whole.params()));
  }
  // An update: new master weights, larger in the first shard, so that a cut matrix's amax is
  // one rank's alone.
  std::mt19937 rng(4);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  float* w = whole.weights().data<float>();
  for (int64_t i = 0; i < n; ++i) w[i] += noise(rng) * (i < shards[0].end ? 3.0f : 1.0f);
  whole.refresh_working();
  std::vector<float> amax(L.matrices().size(), 0.0f);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::memcpy(ranks[r]->weights().raw_data(), w + shards[r].begin,
                static_cast<size_t>(shards[r].size()) * sizeof(float));
    const std::vector<float> part =
        fp8_weights_amax(L, ranks[r]->weights(), shards[r].begin, shards[r]);
    for (size_t i = 0; i < amax.size(); ++i) amax[i] = fp8_amax_combine(amax[i], part[i]);
  }
  const std::vector<int64_t> compact = layout.compact_offsets();
  for (size_t r = 0; r < ranks.size(); ++r) {
    Transformer& t = *ranks[r];
    fp8_weights_set_scales(L, amax, t.fp8_buffer());
    fp8_round_compact(layout, compact, t.params(), t.weights(), shards[r].begin, shards[r]);
    fp8_weights_encode_part(L, t.weights(), shards[r].begin, shards[r], t.fp8_buffer());
  }
  // Each element's bytes from its owner, over copies whose parameters and matrices are cleared.
  std::vector<uint8_t> slab(bytes(whole.params())), codes(bytes(whole.fp8_buffer()));
  std::memset(codes.data(), 0, L.scales_at());
  const auto& ps = layout.params();
  for (size_t i = 0; i < ps.size(); ++i)
    if (compact[i] >= 0)
      std::memset(slab.data() + compact[i] * 2, 0, static_cast<size_t>(ps[i].numel) * 2);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<uint8_t> s = bytes(ranks[r]->params()), f = bytes(ranks[r]->fp8_buffer());
    EXPECT_EQ(std::memcmp(f.data() + L.scales_at(), codes.data() + L.scales_at(),
                          L.bytes() - L.scales_at()),
              0)
        << "rank " << r << "'s scales";
    for (size_t i = 0; i < ps.size(); ++i) {
      const ElementRange part = shards[r].intersect({ps[i].offset, ps[i].offset + ps[i].numel});
      if (part.empty() || compact[i] < 0) continue;
      const size_t at = static_cast<size_t>(compact[i] + part.begin - ps[i].offset) * 2;
      std::memcpy(slab.data() + at, s.data() + at, static_cast<size_t>(part.size()) * 2);
    }
    for (const Fp8Matrix& m : L.matrices()) {
      const ElementRange part =
          shards[r].intersect({m.layout_offset, m.layout_offset + m.rows * m.cols});
      if (part.empty()) continue;
      const size_t at = m.at + static_cast<size_t>(part.begin - m.layout_offset);
      std::memcpy(codes.data() + at, f.data() + at, static_cast<size_t>(part.size()));
    }
  }
  EXPECT_TRUE(slab == bytes(whole.params()));
  const std::vector<uint8_t> want = bytes(whole.fp8_buffer());
  for (const Fp8Matrix& m : L.matrices())
    EXPECT_EQ(std::memcmp(codes.data() + m.at, want.data() + m.at,
                          static_cast<size_t>(m.rows * m.cols)),
              0)
        << "layer " << m.layer << " slot " << int(m.slot);
}

TEST(Fp8ShardCombine, IsTheMaxAndKeepsANan) {
  EXPECT_EQ(fp8_amax_combine(0.0f, 3.5f), 3.5f);
  EXPECT_EQ(fp8_amax_combine(2.0f, 1.0f), 2.0f);
  EXPECT_TRUE(std::isnan(fp8_amax_combine(std::nanf(""), 1.0f)));
  EXPECT_TRUE(std::isnan(fp8_amax_combine(1.0f, std::nanf(""))));
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8Shard, ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

}  // namespace
}  // namespace memfit
