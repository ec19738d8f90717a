// A pipeline stage's own parameter layout (ModelConfig::stage, ParamLayout's stage constructor;
// Note [Pipeline parallel]): the stages' layouts tile the whole model's, each a contiguous run of
// it at whole_offset(); a stage's model allocates its parameters alone, draws the whole model's
// initial weights for them (under --tp its tensor rank's slices of them), and runs its part of
// the step on them; a tied model's last stage holds a copy of the token table for its LM head,
// drawn as the table (model/stage_offsets.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "memfit/core/error.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/model/stage_offsets.h"
#include "memfit/model/step_plan.h"
#include "memfit/model/tensor_group.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/model/transformer.h"

#include "tiny_llama.h"

namespace memfit {
namespace {

ModelConfig untied(int n_layer) { return test::tiny_llama(n_layer); }

ModelConfig of_stage(ModelConfig c, const PipelineStage& s) {
  c.set_pipeline_stage(s);
  return c;
}

TEST(StageLayout, StagesTileTheWholeLayout) {
  const ModelConfig c = untied(5);
  const ParamLayout whole(c);
  for (const auto& [P, layers] : std::vector<std::pair<int, std::string>>{
           {1, "auto"}, {2, "auto"}, {3, "auto"}, {5, "auto"}, {2, "1,4"}, {3, "3,1,1"}}) {
    const std::vector<PipelineStage> stages = split_stages(layers, c.n_layer, P);
    int64_t at = 0;
    size_t i = 0;  // the whole layout's next parameter
    for (const PipelineStage& s : stages) {
      const ParamLayout layout(of_stage(c, s));
      EXPECT_EQ(layout.whole_offset(), at) << P << " " << layers << ", stage " << s.index;
      for (const ParamInfo& p : layout.params()) {
        ASSERT_LT(i, whole.params().size());
        const ParamInfo& w = whole.params()[i++];
        EXPECT_EQ(p.name, w.name);
        EXPECT_EQ(p.shape, w.shape);
        EXPECT_EQ(p.offset + at, w.offset) << p.name;
        EXPECT_EQ(p.layer, w.layer);
      }
      at += layout.total();
      // Its units: the embeddings on the first stage, its blocks, the tail on the last.
      EXPECT_EQ(unit_ranges(layout).size(),
                size_t(s.blocks() + (P > 1 && s.has_embeddings()) + (P > 1 && s.has_head()) +
                       (P == 1 ? 2 : 0)));
    }
    EXPECT_EQ(i, whole.params().size()) << P << " " << layers;
    EXPECT_EQ(at, whole.total()) << P << " " << layers;
  }
}

TEST(StageLayout, ViewsHoldTheStagesPartsAlone) {
  const ModelConfig c = untied(4);
  const std::vector<PipelineStage> stages = split_stages_evenly(c.n_layer, 3);  // 1-2 / 3 / 4
  MemoryPool pool;
  for (const PipelineStage& s : stages) {
    const ParamLayout layout(of_stage(c, s));
    const Tensor slab = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "p");
    const ModelWeights w = layout.views(slab);
    ASSERT_EQ(w.blocks.size(), size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l)
      EXPECT_EQ(w.blocks[l].qkv_w.defined(), l >= s.first && l < s.last) << s.index << " " << l;
    EXPECT_EQ(w.tok_emb.defined(), s.has_embeddings());
    EXPECT_EQ(w.head.defined(), s.has_head());
    EXPECT_EQ(w.norm_w.defined(), s.has_head());
  }
}

// Each stage's model: its parameters alone (the pool's params bytes), the bits the whole model
// draws for them, and a step plan of its own phases.
TEST(StageLayout, AStagesModelHoldsAndDrawsItsPartOfTheWholeModel) {
  const ModelConfig c = untied(4);
  MemoryPool whole_pool;
  Transformer whole(c, whole_pool);
  whole.init_weights(5);
  int64_t at = 0;
  for (const PipelineStage& s : split_stages(std::string("1,3"), c.n_layer, 2)) {
    MemoryPool pool;
    const ModelConfig sc = of_stage(c, s);
    Transformer st(sc, pool);
    st.init_weights(5);
    const int64_t n = st.layout().total();
    EXPECT_LT(n, whole.layout().total());
    EXPECT_EQ(pool.bytes_current(Category::params), MemoryPool::round_up(size_t(n) * 4));
    EXPECT_EQ(std::memcmp(st.params().data<float>(), whole.params().data<float>() + at,
                          size_t(n) * sizeof(float)),
              0)
        << "stage " << s.index;
    at += n;
    ActivationOptions o;
    st.reserve(2, 8, o);
    EXPECT_EQ(st.step_plan().arena, plan_step(sc, 2, 8, o).arena);
    EXPECT_LT(st.step_plan().phases.size(), plan_step(c, 2, 8, o).phases.size());
  }
}

// Tied embeddings (Note [Pipeline parallel], "Tied embeddings"): the first stage holds the
// table, the last a copy of it after its final norm (a unit of its own, under the table's name),
// the stages between neither; the copy's elements are the table's in the whole model (its
// initial weights drawn alike) and the last stage's LM head reads it.
TEST(StageLayout, ATiedModelsLastStageHoldsACopyOfTheTable) {
  ModelConfig c = untied(4);
  c.tie_embeddings = true;
  const ParamLayout whole(c);
  const ParamInfo table = whole.params().front();
  ASSERT_EQ(table.role, ParamRole::token_embedding);
  const std::vector<PipelineStage> stages = split_stages_evenly(c.n_layer, 3);
  MemoryPool whole_pool;
  Transformer model(c, whole_pool);
  model.init_weights(5);
  int64_t run = 0;  // the stages' runs of the whole layout, without the copy
  for (const PipelineStage& s : stages) {
    const ModelConfig sc = of_stage(c, s);
    const ParamLayout layout(sc);
    const ElementRange copy = tied_table_copy(layout);
    EXPECT_EQ(copy.empty(), !s.has_head()) << s.index;
    EXPECT_EQ(tied_table(sc, layout).empty(), !s.has_head() && !s.has_embeddings()) << s.index;
    if (s.has_embeddings()) {
      EXPECT_EQ(tied_table(sc, layout), (ElementRange{0, table.numel}));
    }
    EXPECT_EQ(layout.whole_offset(), run);
    run += layout.total() - copy.size();
    MemoryPool pool;
    Transformer st(sc, pool);
    st.init_weights(5);
    const float* mine = st.params().data<float>();
    const float* all = model.params().data<float>();
    // The stage's run of the whole draw, and the copy drawn as the table.
    EXPECT_EQ(std::memcmp(mine, all + layout.whole_offset(),
                          size_t(layout.total() - copy.size()) * sizeof(float)),
              0)
        << s.index;
    const ModelWeights w = layout.views(st.params());
    EXPECT_EQ(w.head.defined(), s.has_head());
    if (!s.has_head()) continue;
    const ParamInfo& last = layout.params().back();
    EXPECT_EQ(last.name, table.name);
    EXPECT_EQ(last.shape, table.shape);
    EXPECT_EQ(last.role, ParamRole::token_embedding);
    EXPECT_EQ(copy, (ElementRange{last.offset, last.offset + last.numel}));
    EXPECT_EQ(copy.end, layout.total());
    EXPECT_EQ(unit_ranges(layout).back(), copy);
    EXPECT_EQ(whole_index(layout, copy.begin + 7), 7);
    EXPECT_EQ(whole_index(layout, 3), layout.whole_offset() + 3);
    EXPECT_EQ(std::memcmp(mine + copy.begin, all, size_t(table.numel) * sizeof(float)), 0);
    EXPECT_EQ(w.head.data<float>(), w.tok_emb.data<float>());  // the head reads the copy
    EXPECT_EQ(w.tok_emb.data<float>(), mine + copy.begin);
  }
  EXPECT_EQ(run, whole.total());
}

// Rank `rank` of a tensor group of `size`, for drawing weights alone (no collective runs).
class DrawOnlyGroup final : public TensorGroup {
 public:
  DrawOnlyGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(std::span<float>) override { FAIL() << "a collective"; }
  void all_reduce_sum(std::span<double>) override { FAIL() << "a collective"; }
  void all_reduce_max(std::span<float>) override { FAIL() << "a collective"; }
  void all_gather(std::span<const float>, std::span<float>) override { FAIL() << "a collective"; }
  void reduce_scatter_sum(std::span<const float>, std::span<float>) override {
    FAIL() << "a collective";
  }

 private:
  int rank_, size_;
};

// --pp with --tp (Note [Pipeline parallel], "Stages of tensor groups"): the model of a stage on
// a tensor rank holds that rank's slices of the stage's parameters, and draws the whole model's
// bits for them (the slices map onto the stage at tp 1, which lies at its whole_offset() in the
// whole model); padding rows 0.
TEST(StageLayout, AStageOfATensorRankDrawsItsSliceOfTheWholeModel) {
  const ModelConfig c = untied(4);
  MemoryPool whole_pool;
  Transformer whole(c, whole_pool);
  whole.init_weights(5);
  const float* all = whole.params().data<float>();
  for (const PipelineStage& s : split_stages(std::string("1,3"), c.n_layer, 2))
    for (int t = 0; t < 2; ++t) {
      ModelConfig sc = c;
      sc.set_tensor_parallel(2);
      sc.set_pipeline_stage(s);
      const int64_t at = ParamLayout(of_stage(c, s)).whole_offset();
      MemoryPool pool;
      Transformer st(sc, pool);
      DrawOnlyGroup group(t, 2);
      st.set_tensor_group(group);
      st.init_weights(5);
      const float* mine = st.params().data<float>();
      int64_t compared = 0;
      for (const SliceRun& r : tensor_slice_runs(sc, t))
        for (int64_t i = 0; i < r.n; ++i, ++compared)
          ASSERT_EQ(mine[r.local + i], r.whole < 0 ? 0.0f : all[at + r.whole + i])
              << "stage " << s.index << ", tensor rank " << t << ", element " << r.local + i;
      EXPECT_GT(compared, st.layout().total() / 2) << "stage " << s.index << ", rank " << t;
      EXPECT_LT(st.layout().total(), ParamLayout(of_stage(c, s)).total());
    }
}

TEST(StageLayout, BadCutsAreRefusedNamingPp) {
  ModelConfig c = untied(4);
  EXPECT_THROW(c.set_pipeline_stage({1, 2, 2, 3}), ConfigError);  // the last stage ends early
  EXPECT_THROW(c.set_pipeline_stage({0, 2, 1, 2}), ConfigError);  // the first starts late
  c.set_pipeline_stage({1, 2, 2, 4});
  EXPECT_TRUE(c.pipelined());
  c.set_pipeline_stage({});
  EXPECT_FALSE(c.pipelined());
  EXPECT_EQ(ParamLayout(c).total(), ParamLayout(untied(4)).total());
}

}  // namespace
}  // namespace memfit
