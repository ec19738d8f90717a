// Tensor parallelism in the step (Note [Tensor parallel], docs/notes/tensor-parallel.md): the
// whole world that runs the binary as one tensor group (alone: a group of one; in CI under
// `mpirun -n 2` and `-n 4`), GPT-2 and LLaMA (grouped-query attention, n_kv_head divided by the
// group), without checkpointing and with --ckpt full (recomputation re-issues the
// collectives), flash and plain attention. Every rank trains the whole model itself (one
// process, tp 1) and its slice (tp = the world) from the same seed, and checks: its slice's
// initial weights are the whole model's bits; the loss within 1e-5 relative, and its slice of
// every gradient within 1e-5 of the whole gradient's norm (the sums over the group add in
// another order than one GEMM, so not bit for bit); then after three SGD steps on both, the
// losses again. A group of one must give the whole model's bits exactly. With sequence
// parallelism (--sp, Note [Sequence parallel]) too: the residual stream split over the group,
// gathers and reduce-scatters instead of the all-reduces, the norms' partial gradients summed.
// No ASSERT before a collective (a rank that returned early would leave the others waiting).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/dist/communicator.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/step_plan.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/model/transformer.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

ModelConfig tp_model(Family family, int kv_heads = 4) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.n_head = 8;
  c.n_kv_head = family == Family::llama ? kv_heads : 0;  // LLaMA: grouped-query attention
  c.d_model = 64;
  c.ffn_dim = family == Family::llama ? 128 : 0;
  c.max_seq_len = 32;
  c.vocab_size = 301;  // 320 rows whole; over 4 ranks 64 rows each, the last with 45 real
  c.tie_embeddings = family == Family::gpt2;
  c.finalize();
  return c;
}

Tensor tokens_of(MemoryPool& pool, int B, int T, int V, uint32_t seed) {
  Tensor t = Tensor::empty(pool, {B, T}, DType::i32, Category::activations, "tokens");
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

// sqrt(sum (a - b)^2) / sqrt(sum b^2) over the rank's runs: its slice against the whole.
double relative_error(const std::vector<SliceRun>& runs, const float* local, const float* whole) {
  double diff = 0, norm = 0;
  for (const SliceRun& r : runs) {
    if (r.whole < 0) continue;
    for (int64_t i = 0; i < r.n; ++i) {
      const double a = local[r.local + i], b = whole[r.whole + i];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
  }
  return std::sqrt(diff) / std::max(1e-30, std::sqrt(norm));
}

void sgd(Transformer& m, float lr) {
  float* w = m.weights().data<float>();
  const float* g = m.grads().data<float>();
  for (int64_t i = 0; i < m.weights().numel(); ++i) w[i] -= lr * g[i];
}

void check_step(Family family, const char* ckpt, AttentionKind attention, int kv_heads = 4,
                bool sp = false) {
  const int B = 2, T = 16;
  const ModelConfig whole_config = tp_model(family, kv_heads);
  ModelConfig config = whole_config;
  config.set_tensor_parallel(world().size());
  CommunicatorTensorGroup group(world());
  MemoryPool pool_whole, pool_tp;
  Transformer whole(whole_config, pool_whole), part(config, pool_tp);
  part.set_tensor_group(group);
  whole.init_weights(7);
  part.init_weights(7);
  ActivationOptions options;
  options.attention = attention;
  options.ckpt = CheckpointPolicy::parse(ckpt);
  whole.reserve(B, T, options);
  options.sequence_parallel = sp;
  part.reserve(B, T, options);
  const std::vector<SliceRun> runs = tensor_slice_runs(config, group.rank());
  const std::string at = fmt::format("{} ({} kv heads) --ckpt {} {}{} rank {} of {}",
                                     family_name(family), whole_config.n_kv_head, ckpt,
                                     attention == AttentionKind::flash ? "flash" : "plain",
                                     sp ? " --sp" : "", group.rank(), group.size());
  EXPECT_EQ(relative_error(runs, part.weights().data<float>(), whole.weights().data<float>()), 0)
      << at << ": the slice's initial weights are not the whole model's";
  const double tol = group.size() == 1 ? 0.0 : 1e-5;
  for (int step = 0; step < 3; ++step) {
    Tensor tokens = tokens_of(pool_whole, B, T, whole_config.vocab_size, 11 + step);
    Tensor targets = tokens_of(pool_whole, B, T, whole_config.vocab_size, 99 + step);
    whole.zero_grad();
    part.zero_grad();
    const float lw = whole.forward(tokens, targets, true);
    const float lp = part.forward(tokens, targets, true);
    whole.backward();
    part.backward();
    part.reduce_kv_replicas();  // the update's first acts (fewer kv heads than ranks)
    part.reduce_sequence_partials();  // (--sp: the norms' gradients)
    EXPECT_LE(std::abs(lp - lw), tol * std::abs(lw)) << at << " step " << step << ": " << lp
                                                     << " against " << lw;
    const double e = relative_error(runs, part.grads().data<float>(), whole.grads().data<float>());
    EXPECT_LE(e, tol) << at << " step " << step << ": gradients";
    sgd(whole, 0.05f);
    sgd(part, 0.05f);
    const double ew =
        relative_error(runs, part.weights().data<float>(), whole.weights().data<float>());
    EXPECT_LE(ew, tol) << at << " step " << step << ": weights";
  }
}

TEST(TensorParallelStep, Gpt2MatchesOneProcess) {
  check_step(Family::gpt2, "none", AttentionKind::flash);
  check_step(Family::gpt2, "full", AttentionKind::flash);
  check_step(Family::gpt2, "none", AttentionKind::plain);
}

TEST(TensorParallelStep, LlamaMatchesOneProcess) {
  check_step(Family::llama, "none", AttentionKind::flash);
  check_step(Family::llama, "full", AttentionKind::flash);
  check_step(Family::llama, "none", AttentionKind::plain);
}

// One key/value head for 8 queries: over 2 and 4 ranks each rank holds the one head, replicated,
// and the replicas' gradients are summed (Note [Tensor parallel], "Grouped-query attention").
TEST(TensorParallelStep, LlamaWithFewerKvHeadsThanRanksMatchesOneProcess) {
  check_step(Family::llama, "none", AttentionKind::flash, 1);
  check_step(Family::llama, "full", AttentionKind::plain, 1);
}

// --sp: every rank holds 1/T of the 2 x 16 tokens between the split linears.
TEST(TensorParallelStep, SequenceParallelGpt2MatchesOneProcess) {
  check_step(Family::gpt2, "none", AttentionKind::flash, 4, true);
  check_step(Family::gpt2, "full", AttentionKind::plain, 4, true);
}

TEST(TensorParallelStep, SequenceParallelLlamaMatchesOneProcess) {
  check_step(Family::llama, "none", AttentionKind::flash, 4, true);
  check_step(Family::llama, "full", AttentionKind::plain, 1, true);  // kv heads replicated
}

// The residual stream, block outputs and norm statistics are 1/T of the tokens under --sp; the
// planned activations fall by exactly what they held (and the gathers' whole rows are
// workspace, "ws.sp.whole").
TEST(TensorParallelStep, SequenceParallelPlansTheStreamPerRank) {
  ModelConfig config = tp_model(Family::gpt2);
  config.set_tensor_parallel(4);
  ActivationOptions options;
  const StepPlan tp = plan_step(config, 2, 16, options);
  options.sequence_parallel = true;
  const StepPlan sp = plan_step(config, 2, 16, options);
  auto buffer = [](const StepPlan& p, const std::string& tag) -> const BufferSpec* {
    for (const BufferSpec& b : p.buffers)
      if (b.tag == tag) return &b;
    return nullptr;
  };
  for (const char* tag : {"encoded", "h.0.residual_2", "h.0.residual_3", "h.1.ln_1.mean",
                          "ws.dresidual"}) {
    const BufferSpec *a = buffer(tp, tag), *b = buffer(sp, tag);
    ASSERT_TRUE(a && b) << tag;
    EXPECT_EQ(b->shape.numel() * 4, a->shape.numel()) << tag;
  }
  for (const char* tag : {"h.0.qkv", "h.0.fch", "ln_f", "ws.dC"}) {  // whole rows still
    const BufferSpec *a = buffer(tp, tag), *b = buffer(sp, tag);
    ASSERT_TRUE(a && b) << tag;
    EXPECT_EQ(b->shape.numel(), a->shape.numel()) << tag;
  }
  EXPECT_EQ(buffer(tp, "ws.sp.whole"), nullptr);
  ASSERT_NE(buffer(sp, "ws.sp.whole"), nullptr);
  const auto act = static_cast<size_t>(Category::activations);
  EXPECT_LT(sp.arena[act], tp.arena[act]);
  // A sequence that does not divide by --tp is refused naming both.
  try {
    plan_step(config, 2, 18, options);
    ADD_FAILURE() << "--sp accepted 18 tokens over 4 ranks";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-len 18"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tp 4"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelStep, RefusesATpThatDoesNotDivideTheModel) {
  ModelConfig c = tp_model(Family::llama);
  try {
    c.set_tensor_parallel(3);
    ADD_FAILURE() << "--tp 3 accepted for 8 heads";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n_head"), std::string::npos) << e.what();
  }
  ModelConfig k = tp_model(Family::llama);
  k.set_tensor_parallel(8);  // 4 kv heads: each on 2 ranks
  EXPECT_EQ(k.local_kv_heads(), 1);
  EXPECT_EQ(k.kv_replicas(), 2);
  ModelConfig odd = tp_model(Family::llama);
  odd.n_head = 6;
  odd.n_kv_head = 3;
  odd.d_model = 48;
  odd.finalize();
  try {
    odd.set_tensor_parallel(2);  // divides 6 heads, neither divides nor is a multiple of 3
    ADD_FAILURE() << "--tp 2 accepted for 3 key/value heads";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_head 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit::dist
