// The transformer cut into pipeline stages (ActivationOptions::stage, StageIo; Note [Pipeline
// parallel]) and run by the pipeline runner on whatever world runs the binary: alone, and under
// `mpirun -n 2` and `-n 4` (ctest's dist_mpi_2ranks and dist_mpi_4ranks) as every pipeline x data
// grid that tiles the world (pp 2, pp 4, pp 2 x dp 2). For LLaMA (untied; a tied model's stages,
// which sum the table's gradient, are tests/cli/pipeline_tied_test.cpp's), with --ckpt none, full
// and every:2, under GPipe and 1F1B: each stage's gradients, summed over the micro-batches, and
// each micro-batch's loss are the bits of one process running the micro-batches in turn; the
// parameters other stages own get no gradient; and the stage's activations are its plan's arena
// plus the inputs the schedule keeps, its workspace the plan's, its comm the runner's transfer
// buffers, byte for byte. Interleaved (pp 2 with 2 and 3 chunks a rank, pp 4 with 2): each rank
// runs its chunks (virtual stages c x P + rank of P x V) as one stage model each, with the same
// bits and counts.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <memory>
#include <random>
#include <vector>

#include "memfit/core/scoped_threads.h"
#include "memfit/dist/pipeline_runner.h"
#include "memfit/dist/process_grid.h"
#include "memfit/model/transformer.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

ModelConfig four_layers(Family family, int layers = 4) {
  ModelConfig c;
  c.family = family;
  if (family == Family::llama) c.n_kv_head = 1, c.ffn_dim = 48, c.tie_embeddings = false;
  c.n_layer = layers;
  c.n_head = 2;
  c.d_model = 32;
  c.max_seq_len = 24;
  c.vocab_size = 90;
  c.finalize();
  return c;
}

constexpr int B = 2, T = 11;

struct Batches {
  std::vector<Tensor> tokens, targets;
  Batches(MemoryPool& pool, const ModelConfig& c, int replica, int m) {
    std::mt19937 rng(static_cast<unsigned>(7 + replica));
    for (int i = 0; i < m; ++i) {
      tokens.push_back(Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens"));
      targets.push_back(Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "targets"));
      for (int64_t k = 0; k < B * T; ++k) {
        tokens.back().data<int32_t>()[k] = static_cast<int32_t>(rng() % c.vocab_size);
        targets.back().data<int32_t>()[k] = static_cast<int32_t>(rng() % c.vocab_size);
      }
    }
  }
};

// Whether stage `s` owns parameter p: its blocks, the embeddings on the first, the final norm
// and the head on the last.
bool owns(const PipelineStage& s, const ParamInfo& p) {
  if (p.layer >= 0) return p.layer >= s.first && p.layer < s.last;
  if (p.role == ParamRole::token_embedding || p.role == ParamRole::position_embedding)
    return s.has_embeddings();
  return s.has_head();
}

struct Case {
  Family family;
  const char* ckpt;
  PipeSchedule schedule;
  int m;
};

void run_case(const ProcessGrid& grid, const Case& k) {
  const int P = grid.shape().pipeline, s = grid.coords().pipeline;
  const std::string what = fmt::format("{} ckpt {} {} m {} on {}", family_name(k.family), k.ckpt,
                                       pipe_schedule_name(k.schedule), k.m,
                                       grid.shape().describe());
  const ModelConfig c = four_layers(k.family);
  ActivationOptions o;
  o.ckpt = CheckpointPolicy::parse(k.ckpt);

  // One process: the micro-batches in turn.
  MemoryPool ref_pool;
  Batches data(ref_pool, c, grid.coords().data, k.m);
  Transformer ref(c, ref_pool);
  ref.init_weights(11);
  ref.reserve(B, T, o);
  std::vector<float> ref_losses;
  for (int i = 0; i < k.m; ++i) {
    ref_losses.push_back(ref.forward(data.tokens[i], data.targets[i], true));
    ref.backward();
  }

  // This rank's stage.
  MemoryPool pool;
  Transformer st(c, pool);
  st.init_weights(11);
  const PipelineStage stage = split_stages_evenly(c.n_layer, P)[static_cast<size_t>(s)];
  ActivationOptions so = o;
  so.stage = stage;
  st.reserve(B, T, so);
  const auto arena_of = [&](Category c) {
    return static_cast<int64_t>(st.step_plan().arena[static_cast<size_t>(c)]);
  };
  const int64_t arena = arena_of(Category::activations);
  std::vector<float> losses(static_cast<size_t>(k.m), -1.0f);
  {
    PipelineRunner runner(grid.pipeline(), k.schedule, k.m, int64_t{B} * T * c.d_model, pool);
    runner.run(
        {[&](int mb, std::span<const float> in, std::span<float> out) {
           if (stage.has_head()) return;  // its forward runs with the backward
           st.set_stage_io({in.data(), out.data(), nullptr, nullptr});
           st.forward(data.tokens[mb], data.targets[mb], /*training=*/false);
         },
         [&](int mb, std::span<const float> in, std::span<const float> dout,
             std::span<float> din) {
           // Re-materialisation: the stage's forward again from its kept input, then backward.
           st.set_stage_io({in.data(), nullptr, dout.data(), din.data()});
           losses[static_cast<size_t>(mb)] = st.forward(data.tokens[mb], data.targets[mb], true);
           st.backward();
         }});
    const PipelineBuffers extra =
        pipeline_buffers(k.schedule, s, P, k.m, int64_t{B} * T * c.d_model * 4);
    EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::activations)),
              arena + extra.activations)
        << what;
    EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::workspace)),
              arena_of(Category::workspace))
        << what;
    EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::comm)), extra.comm) << what;
  }
  int differ = 0, stray = 0;
  const float* g = st.grads().data<float>();
  const float* want = ref.grads().data<float>();
  for (const ParamInfo& p : st.layout().params())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      if (owns(stage, p))
        differ += g[i] != want[i];
      else
        stray += g[i] != 0.0f;
    }
  EXPECT_EQ(differ, 0) << what << ": stage " << s << "'s gradients";
  EXPECT_EQ(stray, 0) << what << ": gradients of other stages' parameters";
  if (stage.has_head()) {
    for (int i = 0; i < k.m; ++i) EXPECT_EQ(losses[i], ref_losses[i]) << what << " micro-batch " << i;
  }
}

// Interleaved: this rank's V chunks, each a stage model of the P x V virtual stages (one block
// or two each), through the runner's chunk order; each chunk's gradients and the last virtual
// stage's losses against one process, and the buffers: every chunk's arena, plus the runner's.
void run_interleaved(const ProcessGrid& grid, int V, int layers, int m, const char* ckpt) {
  const int P = grid.shape().pipeline, r = grid.coords().pipeline;
  const std::string what =
      fmt::format("interleaved V {} layers {} m {} ckpt {} on {}", V, layers, m, ckpt,
                  grid.shape().describe());
  const ModelConfig c = four_layers(Family::llama, layers);
  ActivationOptions o;
  o.ckpt = CheckpointPolicy::parse(ckpt);
  MemoryPool ref_pool;
  Batches data(ref_pool, c, grid.coords().data, m);
  Transformer ref(c, ref_pool);
  ref.init_weights(11);
  ref.reserve(B, T, o);
  std::vector<float> ref_losses;
  for (int i = 0; i < m; ++i) {
    ref_losses.push_back(ref.forward(data.tokens[i], data.targets[i], true));
    ref.backward();
  }

  MemoryPool pool;
  const std::vector<PipelineStage> virtual_stages = split_stages_evenly(c.n_layer, P * V);
  std::vector<std::unique_ptr<Transformer>> chunks;
  std::vector<PipelineStage> mine;
  int64_t arenas = 0, workspaces = 0;
  for (int k = 0; k < V; ++k) {
    mine.push_back(virtual_stages[static_cast<size_t>(virtual_stage(r, k, P))]);
    chunks.push_back(std::make_unique<Transformer>(c, pool));
    chunks.back()->init_weights(11);
    ActivationOptions so = o;
    so.stage = mine.back();
    chunks.back()->reserve(B, T, so);
    const StepPlan& plan = chunks.back()->step_plan();
    arenas += static_cast<int64_t>(plan.arena[static_cast<size_t>(Category::activations)]);
    workspaces += static_cast<int64_t>(plan.arena[static_cast<size_t>(Category::workspace)]);
  }
  std::vector<float> losses(static_cast<size_t>(m), -1.0f);
  {
    PipelineRunner runner(grid.pipeline(), PipeSchedule::one_f_one_b, m,
                          int64_t{B} * T * c.d_model, pool, V);
    runner.run_chunks(
        {[&](int k, int mb, std::span<const float> in, std::span<float> out) {
           if (mine[static_cast<size_t>(k)].has_head()) return;  // runs with the backward
           Transformer& st = *chunks[static_cast<size_t>(k)];
           st.set_stage_io({in.data(), out.data(), nullptr, nullptr});
           st.forward(data.tokens[mb], data.targets[mb], /*training=*/false);
         },
         [&](int k, int mb, std::span<const float> in, std::span<const float> dout,
             std::span<float> din) {
           Transformer& st = *chunks[static_cast<size_t>(k)];
           st.set_stage_io({in.data(), nullptr, dout.data(), din.data()});
           const float loss = st.forward(data.tokens[mb], data.targets[mb], true);
           if (mine[static_cast<size_t>(k)].has_head()) losses[static_cast<size_t>(mb)] = loss;
           st.backward();
         }});
    const PipelineBuffers extra = pipeline_buffers(PipeSchedule::one_f_one_b, r, P, m,
                                                   int64_t{B} * T * c.d_model * 4, V);
    EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::activations)),
              arenas + extra.activations)
        << what;
    EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::workspace)), workspaces) << what;
    EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::comm)), extra.comm) << what;
  }
  const float* want = ref.grads().data<float>();
  for (int k = 0; k < V; ++k) {
    int differ = 0, stray = 0;
    const float* g = chunks[static_cast<size_t>(k)]->grads().data<float>();
    for (const ParamInfo& p : chunks[static_cast<size_t>(k)]->layout().params())
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        if (owns(mine[static_cast<size_t>(k)], p))
          differ += g[i] != want[i];
        else
          stray += g[i] != 0.0f;
      }
    EXPECT_EQ(differ, 0) << what << ": rank " << r << " chunk " << k << "'s gradients";
    EXPECT_EQ(stray, 0) << what << ": gradients of other chunks' parameters";
  }
  if (r == P - 1) {
    for (int i = 0; i < m; ++i)
      EXPECT_EQ(losses[static_cast<size_t>(i)], ref_losses[static_cast<size_t>(i)])
          << what << " micro-batch " << i;
  }
}

TEST(PipelineModel, StagesGiveOneProcesssGradientsAndLossesBitForBit) {
  Communicator& w = world();
  const int W = w.size();
  // One thread a rank: four ranks on two cores with OpenMP's spinning workers crawl.
  const ScopedThreads one(W > 1 ? 1 : 0);
  for (int P = 1; P <= W && P <= 4; ++P) {
    if (W % P) continue;
    ProcessGrid grid(w, GridShape{W / P, P, 1});
    for (const char* ckpt : {"none", "full"})
      for (PipeSchedule sched : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
        run_case(grid, {Family::llama, ckpt, sched, 3});
    // Two-block segments fit a cut into halves (at 4 stages they would cross it: refused).
    run_case(grid, {Family::llama, P <= 2 ? "every:2" : "full", PipeSchedule::one_f_one_b, 6});
    // Interleaved (P of 2 or more): 2 chunks a rank over P x 2 blocks (m = P and 2 P), 3 over
    // 6 at pp 2 with --ckpt full.
    if (P >= 2) {
      run_interleaved(grid, 2, 2 * P, P, "none");
      run_interleaved(grid, 2, 2 * P, 2 * P, "none");
      if (P == 2) run_interleaved(grid, 3, 6, 4, "full");
    }
  }
}

TEST(PipelineModel, AStageOfAMiddleHoldsLessThanTheWholeStep) {
  const ModelConfig c = four_layers(Family::llama);
  ActivationOptions whole;
  ActivationOptions middle;
  middle.stage = split_stages_evenly(c.n_layer, 4)[1];
  const StepPlan a = plan_step(c, B, T, whole), b = plan_step(c, B, T, middle);
  EXPECT_LT(b.arena[static_cast<size_t>(Category::activations)],
            a.arena[static_cast<size_t>(Category::activations)]);
  EXPECT_LT(b.phases.size(), a.phases.size());
}

TEST(PipelineModel, CutsTheStepCannotRunAreRefused) {
  ModelConfig tied = four_layers(Family::gpt2);
  tied.tie_embeddings = true;
  ActivationOptions o;
  o.stage = split_stages_evenly(4, 2)[0];
  EXPECT_NO_THROW(plan_step(tied, B, T, o));  // tied: the last stage reads its copy's head
  const ModelConfig c = four_layers(Family::llama);
  o.ckpt = CheckpointPolicy::parse("every:3");  // blocks 0-2 recomputed together, across 0-1 | 2-3
  EXPECT_THROW(plan_step(c, B, T, o), Error);
  o.ckpt = CheckpointPolicy::parse("every:2");
  EXPECT_NO_THROW(plan_step(c, B, T, o));
}

}  // namespace
}  // namespace memfit::dist
