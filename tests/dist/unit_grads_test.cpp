// Per-unit gradients over the ranks that run the binary (alone, and in CI under mpirun -n 2 and
// -n 4: ctest -L dist-mpi; Note [Sharded gradients]): a backward's unit buffers, filled with
// values that differ by rank, micro-batch and element, leave each rank's accumulator the sums
// in rank order of its shard (uneven shards cut inside units), micro-batches
// added in order, at any bucket size; the whole-layout mode (stages 0-1 reducing every
// micro-batch) gives every rank the same bits; the pool holds what grads_bytes and comm_bytes
// plan. No ASSERT before a collective.
#include "memfit/core/dtype.h"
#include "memfit/dist/zero/unit_grads.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/state/shard.h"

namespace memfit {
namespace {

dist::Communicator& world() {
  static std::unique_ptr<dist::Communicator> w = dist::make_world_communicator();
  return *w;
}

ModelConfig config() {
  ModelConfig c;
  c.n_layer = 3;
  c.n_head = 3;
  c.d_model = 24;
  c.max_seq_len = 16;
  c.vocab_size = 70;
  c.finalize();
  return c;
}

float value(int rank, int micro_batch, int64_t i) {
  return (rank % 2 ? -1.0f : 1.0f) * (1.0f + float(rank) * 1e-3f + float(micro_batch) * 0.37f) *
         float(1 + (i * 7919) % 1013) / float(3 + rank);
}

// Fills the buffer bound to `unit` (its views are views of one buffer laid out as the unit,
// reached through its first parameter: a block's first norm, the embeddings, the final norm)
// with this rank's values of micro-batch m.
void fill(const ParamLayout& layout, const ModelWeights& views, ElementRange unit, int rank,
          int m) {
  const ParamInfo* first = nullptr;
  for (const ParamInfo& p : layout.params())
    if (p.offset >= unit.begin && p.offset < unit.end && (!first || p.offset < first->offset))
      first = &p;
  const Tensor& t = first->layer >= 0 ? views.blocks[static_cast<size_t>(first->layer)].norm1_w
                    : first->role == ParamRole::token_embedding ? views.tok_emb
                                                                : views.norm_w;
  float* at = t.data<float>() - (first->offset - unit.begin);
  for (int64_t i = unit.begin; i < unit.end; ++i) at[i - unit.begin] = value(rank, m, i);
}

// Uneven shards: rank r's end at ((r + 1) / W)^2 of the layout, on 16 elements.
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

std::vector<float> run(size_t bucket_bytes, bool whole, int micro_batches, size_t* grads_bytes,
                       size_t* comm_bytes, DType dtype = DType::f32) {
  dist::Communicator& w = world();
  const ModelConfig c = config();
  const ParamLayout layout(c);
  const std::vector<ElementRange> units = unit_ranges(layout);
  const std::vector<ElementRange> shards = uneven_shards(layout.total(), w.size());
  MemoryPool pool;
  std::vector<float> out;
  {
    UnitGrads g(pool, layout, GradSharding{&w, shards, bucket_bytes, whole, dtype});
    *grads_bytes = pool.bytes_current(Category::grads);
    *comm_bytes = pool.bytes_current(Category::comm);
    g.zero();
    for (int m = 0; m < micro_batches; ++m) {
      g.begin_micro_batch();
      fill(layout, g.views(), units.back(), w.rank(), m);  // the head and tail
      fill(layout, g.views(), units.front(), w.rank(), m);
      g.done(c.n_layer);
      for (int l = c.n_layer - 1; l >= 0; --l) {
        g.enter_backward(l);
        fill(layout, g.views(), units[static_cast<size_t>(1 + l)], w.rank(), m);
        g.done(l);
      }
      g.done(-1);
    }
    const Tensor& s = g.sums();
    EXPECT_EQ(s.dtype(), dtype);
    if (dtype == DType::bf16) {
      const uint16_t* h = static_cast<const uint16_t*>(s.raw_data());
      for (int64_t i = 0; i < s.numel(); ++i) out.push_back(f32_from_bf16(h[i]));
    } else {
      out.assign(s.data<float>(), s.data<float>() + s.numel());
    }
    EXPECT_EQ(g.range(), UnitGrads::sums_range(layout, shards, w.rank(), whole));
    EXPECT_EQ(*grads_bytes, UnitGrads::grads_bytes(layout, shards, w.rank(), whole, dtype));
    EXPECT_EQ(*comm_bytes,
              UnitGrads::comm_bytes(layout, bucket_bytes, shards, w.rank(), whole, dtype));
    // Every unit and micro-batch reduced once (bf16: half the bytes; counted over ranks).
    const dist::CommVolume v = g.take_volume();
    EXPECT_EQ(whole ? v.all_reduce : v.reduce_scatter,
              dtype == DType::f32  ? layout.total() * 4 * micro_batches
              : w.size() > 1       ? layout.total() * 2 * micro_batches
                                   : 0);
    const float one = g.sum(1.0f);
    EXPECT_EQ(one, float(w.size()));
  }
  return out;
}

TEST(UnitGradsRanks, EachOwnerHasItsShardsSumsInRankOrder) {
  dist::Communicator& w = world();
  const ParamLayout layout(config());
  for (size_t bucket_bytes : {size_t{4 * 37}, size_t{4 * 700}, size_t{1} << 20}) {
    for (int micro_batches : {1, 2}) {
      size_t gb = 0, cb = 0;
      const std::vector<float> got = run(bucket_bytes, false, micro_batches, &gb, &cb);
      size_t wgb = 0, wcb = 0;
      const std::vector<float> whole = run(bucket_bytes, true, micro_batches, &wgb, &wcb);
      // Σ_m (Σ_r in rank order), the first micro-batch's copied: the whole layout on every
      // rank in the whole mode, the owner's shard otherwise.
      const ElementRange mine = uneven_shards(layout.total(), w.size())[size_t(w.rank())];
      EXPECT_EQ(whole.size(), size_t(layout.total()));
      EXPECT_EQ(got.size(), size_t(mine.size()));
      for (int64_t i = 0; i < layout.total(); ++i) {
        float want = 0;
        for (int m = 0; m < micro_batches; ++m) {
          float s = value(0, m, i);
          for (int q = 1; q < w.size(); ++q) s += value(q, m, i);
          want = m == 0 ? s : want + s;
        }
        EXPECT_EQ(std::memcmp(&whole[size_t(i)], &want, 4), 0) << "whole, element " << i;
        if (mine.begin <= i && i < mine.end) {
          EXPECT_EQ(std::memcmp(&got[size_t(i - mine.begin)], &want, 4), 0)
              << "shard, element " << i << ", bucket " << bucket_bytes;
        }
      }
      if (w.size() > 1) { EXPECT_LT(gb, wgb); }  // a shard, not the layout
    }
  }
}

// bf16 sums (Note [Gradients in bf16]): each rank's f32 unit buffer rounded to bf16, the ranks'
// values added in f32 in rank order and rounded once, later micro-batches added to the bf16
// accumulator in f32 and rounded once; the same bits in the whole mode (all-reduce) and in each
// owner's shard, with half the f32 accumulator's bytes.
TEST(UnitGradsRanks, Bf16SumsAreRoundedOncePerReductionInRankOrder) {
  dist::Communicator& w = world();
  const ParamLayout layout(config());
  for (size_t bucket_bytes : {size_t{4 * 37}, size_t{1} << 20}) {
    for (int micro_batches : {1, 2}) {
      size_t gb = 0, cb = 0, wgb = 0, wcb = 0, fgb = 0, fcb = 0;
      const std::vector<float> got = run(bucket_bytes, false, micro_batches, &gb, &cb, DType::bf16);
      const std::vector<float> whole =
          run(bucket_bytes, true, micro_batches, &wgb, &wcb, DType::bf16);
      run(bucket_bytes, false, micro_batches, &fgb, &fcb);
      const ElementRange mine = uneven_shards(layout.total(), w.size())[size_t(w.rank())];
      EXPECT_EQ(whole.size(), size_t(layout.total()));
      EXPECT_EQ(got.size(), size_t(mine.size()));
      for (int64_t i = 0; i < layout.total(); ++i) {
        uint16_t want = 0;
        for (int m = 0; m < micro_batches; ++m) {
          float acc = f32_from_bf16(bf16_from_f32(value(0, m, i)));
          for (int q = 1; q < w.size(); ++q) acc += f32_from_bf16(bf16_from_f32(value(q, m, i)));
          const uint16_t s = bf16_from_f32(acc);
          want = m == 0 ? s : bf16_from_f32(f32_from_bf16(want) + f32_from_bf16(s));
        }
        EXPECT_EQ(whole[size_t(i)], f32_from_bf16(want)) << "whole, element " << i;
        if (mine.begin <= i && i < mine.end) {
          EXPECT_EQ(got[size_t(i - mine.begin)], f32_from_bf16(want))
              << "shard, element " << i << ", bucket " << bucket_bytes;
        }
      }
      EXPECT_EQ(gb, MemoryPool::round_up(std::max<size_t>(1, size_t(mine.size()) * 2)));
      EXPECT_LE(gb, fgb);
      EXPECT_LE(cb, fcb);  // the receive ring in bf16
    }
  }
}

}  // namespace
}  // namespace memfit
