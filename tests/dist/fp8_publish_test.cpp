// ZeRO stages 1-2 with --precision fp8's stored working weights (dist/zero/fp8_publish.h; Note
// [FP8], "Storage"), over the ranks that run the binary (alone, and under mpirun -n 2 and -n 4:
// ctest -L dist-mpi): each rank owns an uneven shard of the master weights, cut inside
// matrices and parameters, with values that make the ranks' part amaxes differ; after the
// publish every rank's compact slab, scales and codes are those of one process holding the
// whole master weights (refresh_working), byte for byte, and the bytes gathered are
// fp8_publish_bytes. No ASSERT before a collective.
#include "memfit/dist/zero/fp8_publish.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstring>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/model/fp8_weights.h"
#include "memfit/model/model_config.h"

namespace memfit {
namespace {

dist::Communicator& world() {
  static std::unique_ptr<dist::Communicator> w = dist::make_world_communicator();
  return *w;
}

ModelConfig config(Family family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 24;
  c.max_seq_len = 16;
  c.vocab_size = 70;
  if (family == Family::llama) {
    c.n_kv_head = 2;
    c.ffn_dim = 40;
    c.tie_embeddings = false;
  }
  c.finalize();
  return c;
}

// Rank r's shard ends at ((r + 1) / W)^2 of the layout, on 16 elements.
std::vector<ElementRange> uneven_shards(int64_t n, int ranks) {
  std::vector<ElementRange> shards;
  int64_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    const double f = double(r + 1) / ranks;
    const int64_t end = r + 1 == ranks ? n : std::max(at, int64_t(double(n) * f * f) / 16 * 16);
    shards.push_back({at, end});
    at = end;
  }
  return shards;
}

// The master weight of layout element i: the second half of the layout ten times the first's,
// so a matrix cut near the middle has its amax on one side only.
float value(int64_t i, int64_t n) {
  return std::sin(0.37f * float(i)) * 0.03f * (2 * i >= n ? 10.0f : 1.0f);
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const auto* b = static_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(b, b + t.nbytes());
}

void expect_publish_is_the_whole_refresh(Family family) {
  dist::Communicator& w = world();
  const ModelConfig c = config(family);
  const ParamLayout layout(c);
  const int64_t n = layout.total();
  const std::vector<ElementRange> shards = uneven_shards(n, w.size());
  const ElementRange mine = shards[static_cast<size_t>(w.rank())];
  MemoryPool pool_whole, pool_rank;
  ModelState whole_state;
  whole_state.params_fp8 = true;
  Transformer whole(c, pool_whole, {Precision::fp8, true}, whole_state);
  ModelState rank_state = ModelState::master_shard(mine);
  rank_state.params_fp8 = true;
  Transformer rank(c, pool_rank, {Precision::fp8, true}, rank_state);
  // The set-up from the same draw: every rank holds the whole model's working copy.
  whole.init_weights(7);
  rank.init_weights(7);
  EXPECT_EQ(bytes(rank.fp8_buffer()), bytes(whole.fp8_buffer()));
  EXPECT_EQ(bytes(rank.params()), bytes(whole.params()));
  // New master weights (an update), this rank's shard of them in its model.
  float* all = whole.weights().data<float>();
  for (int64_t i = 0; i < n; ++i) all[i] = value(i, n);
  whole.refresh_working();
  float* part = rank.weights().data<float>();
  for (int64_t i = mine.begin; i < mine.end; ++i) part[i - mine.begin] = value(i, n);
  const int64_t gathered = publish_fp8_weights(rank, w, shards);
  EXPECT_EQ(gathered, fp8_publish_bytes(layout, DType::bf16));
  const Fp8WeightLayout& L = *whole.fp8_weights();
  const std::vector<uint8_t> got = bytes(rank.fp8_buffer()), want = bytes(whole.fp8_buffer());
  EXPECT_EQ(std::memcmp(got.data() + L.scales_at(), want.data() + L.scales_at(),
                        L.bytes() - L.scales_at()),
            0)
      << "the scales";
  for (const Fp8Matrix& m : L.matrices())
    EXPECT_EQ(std::memcmp(got.data() + m.at, want.data() + m.at,
                          static_cast<size_t>(m.rows * m.cols)),
              0)
        << "layer " << m.layer << " slot " << int(m.slot);
  const std::vector<uint8_t> slab = bytes(rank.params()), want_slab = bytes(whole.params());
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const int64_t at = whole.working_offset(i);
    if (at < 0) continue;
    EXPECT_EQ(std::memcmp(slab.data() + at * 2, want_slab.data() + at * 2,
                          static_cast<size_t>(layout.params()[i].numel) * 2),
              0)
        << layout.params()[i].name;
  }
  // Over several ranks a shard boundary falls inside a matrix (what the agreement is for).
  if (w.size() > 1) {
    int cut = 0;
    for (const Fp8Matrix& m : L.matrices())
      for (const ElementRange& s : shards)
        cut += s.begin > m.layout_offset && s.begin < m.layout_offset + m.rows * m.cols;
    EXPECT_GT(cut, 0);
  }
}

TEST(Fp8PublishRanks, EveryRankHoldsTheWholeRefreshGpt2) {
  expect_publish_is_the_whole_refresh(Family::gpt2);
}

TEST(Fp8PublishRanks, EveryRankHoldsTheWholeRefreshLlama) {
  expect_publish_is_the_whole_refresh(Family::llama);
}

}  // namespace
}  // namespace memfit
