// Checkpoints across layouts (io/checkpoint/layout_checkpoint.h) without MPI: the ranks of every
// tp x pp layout, each writing its slices (cut again by a ZeRO-like split of its range) into the
// laid-out files, give the files one process saves of the same weights and AdamW state, byte for
// byte (GPT-2's transposed Conv1D weights through a staging of a few elements, f32 and bf16,
// one file and shards); each rank's load of its part of that save is the whole state's slice; a
// writer killed mid-save, or a crash at any stage of the save that follows, leaves a complete
// checkpoint, the old or the new.
#include "memfit/io/checkpoint/layout_checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/model/layout_map.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/optim/optimizer.h"
#include "memfit/optim/sliced_optimizer.h"
#include "memfit/optim/state_runs.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ModelConfig gpt2() {  // tied; --tp pads its 520-entry table beyond the whole padding
  ModelConfig c = ModelConfig::preset("gpt2-tiny");
  c.vocab_size = 520;
  c.finalize();
  return c;
}
ModelConfig llama() {  // untied, 2 key/value heads (replicated at tp 4)
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.n_layer = 4;
  c.finalize();
  return c;
}

OptimConfig adamw(const ModelConfig& c) {
  OptimConfig o;
  o.name = "adamw";
  o.n_head = c.n_head;
  return o;
}

// A random value in every parameter element of `t` (a tensor over `layout`), zero in the
// alignment gaps and in the vocabulary padding rows (what a one-process run holds there).
void fill_params(Tensor& t, const ModelConfig& c, const ParamLayout& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t es = dtype_size(t.dtype());
  auto* b = static_cast<std::byte*>(t.raw_data());
  std::memset(b, 0, t.nbytes());
  for (const ParamInfo& p : layout.params()) {
    const bool vocab = p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head;
    const int64_t real = vocab ? int64_t{c.vocab_size} * p.shape[1] : p.numel;
    for (int64_t i = 0; i < real; ++i) {
      const float x = normal(rng);
      if (es == 4) {
        std::memcpy(b + (p.offset + i) * es, &x, 4);
      } else {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(b + (p.offset + i) * es, &h, 2);
      }
    }
  }
}

// Rank `t` of `local`'s layout: its elements of `whole` (a tensor over the whole layout) through
// the layout map, zero elsewhere (--tp's padding, the gaps).
Tensor slice_of(const Tensor& whole, const ModelConfig& local, int t, MemoryPool& pool) {
  const ParamLayout layout(local);
  Tensor out = Tensor::empty(pool, {layout.total()}, whole.dtype(), Category::params, "slice");
  const size_t es = dtype_size(whole.dtype());
  for (const SliceRun& r : whole_layout_runs(local, t))
    if (r.whole >= 0)
      std::memcpy(static_cast<std::byte*>(out.raw_data()) + r.local * es,
                  static_cast<const std::byte*>(whole.raw_data()) + r.whole * es, r.n * es);
  return out;
}

// A fresh subdirectory `name` of the test's scratch directory (two ScratchDirs of one test
// would be the same directory).
fs::path fresh(const testing::ScratchDir& root, const std::string& name) {
  const fs::path p = root / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

struct Layout {
  int tp = 1, pp = 1;
};

// Every rank of `lay`: its model config (tp, stage) and tensor rank.
std::vector<std::pair<ModelConfig, int>> ranks(const ModelConfig& whole, Layout lay) {
  std::vector<std::pair<ModelConfig, int>> out;
  const std::vector<PipelineStage> stages =
      lay.pp > 1 ? split_stages("auto", whole.n_layer, lay.pp) : std::vector<PipelineStage>{{}};
  for (const PipelineStage& s : stages)
    for (int t = 0; t < lay.tp; ++t) {
      ModelConfig c = whole;
      if (lay.tp > 1) c.set_tensor_parallel(lay.tp);
      c.set_pipeline_stage(s);
      out.emplace_back(c, t);
    }
  return out;
}

// The whole model's weights and AdamW state, saved by one process (model.safetensors or shards,
// optimizer.safetensors) into `ref`.
struct Whole {
  ModelConfig config;
  ParamLayout layout;
  Tensor weights;
  std::unique_ptr<Optimizer> opt;
  Whole(const ModelConfig& c, DType dtype, MemoryPool& pool)
      : config(c),
        layout(c),
        weights(Tensor::empty(pool, {layout.total()}, dtype, Category::master, "w")),
        opt(make_optimizer(adamw(c), layout, &pool)) {
    fill_params(weights, config, layout, 3);
    uint32_t seed = 5;
    for (auto& [n, t] : opt->state()) fill_params(t, config, layout, seed++);
    opt->set_steps_taken(7);
  }
  void save(const fs::path& ref, uint64_t max_shard_bytes) const {
    WeightsSaveOptions o;
    o.max_shard_bytes = max_shard_bytes;
    save_weights(ref, config, layout, weights, o);
    save_optimizer_state(ref / kOptimizerFile, *opt);
  }
};

// Every rank of `lay` writes its part of `w` into the files laid out in `dir`, its range cut in
// two as two data ranks at ZeRO 1-3 would (each writes its half).
void write_by_layout(const fs::path& dir, const Whole& w, Layout lay, const LayoutFiles& files,
                     MemoryPool& pool) {
  files.create(dir);
  const Tensor staging = Tensor::empty(pool, {7}, DType::f32, Category::staging, "staging");
  const auto whole_opt = make_optimizer(adamw(w.config), w.layout, nullptr, ElementRange{0, 0});
  for (const auto& [c, t] : ranks(w.config, lay)) {
    const Tensor weights = slice_of(w.weights, c, t, pool);
    std::vector<Tensor> state;
    for (auto& [n, s] : w.opt->state()) state.push_back(slice_of(s, c, t, pool));
    const ParamLayout layout(c);
    const int64_t total = layout.total(), half = total / 2 / 16 * 16;
    for (const ElementRange mine : {ElementRange{0, half}, ElementRange{half, total}}) {
      // The rank's AdamW over its range, its state the whole state's slice there.
      const auto o = make_optimizer(adamw(c), layout, &pool, mine);
      size_t i = 0;
      for (auto& [n, s] : o->state())
        std::memcpy(s.raw_data(), static_cast<const float*>(state[i++].raw_data()) + mine.begin,
                    s.nbytes());
      const std::vector<SliceRun> runs = runs_within(first_holder_runs(c, t), mine);
      files.write(dir, runs, weights.raw_data(), 0, save_state_parts(*o, *whole_opt, runs),
                  staging);
    }
  }
}

TEST(LayoutCheckpoint, EveryLayoutWritesTheFilesOneProcessSaves) {
  for (const bool gpt : {true, false})
    for (const DType dtype : {DType::f32, DType::bf16})
      for (const uint64_t shard_bytes : {kDefaultMaxShardBytes, uint64_t{200'000}}) {
        const ModelConfig c = gpt ? gpt2() : llama();
        MemoryPool pool;
        const Whole w(c, dtype, pool);
        testing::ScratchDir root;
        const fs::path ref = fresh(root, "ref");
        w.save(ref, shard_bytes);
        const LayoutFiles files(c, dtype, w.opt.get(), shard_bytes);
        std::vector<std::string> names = files.files();
        std::sort(names.begin(), names.end());
        ASSERT_EQ(names, testing::list_dir(ref));
        for (const Layout lay :
             std::vector<Layout>{{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}, {4, 4}}) {
          if (gpt && lay.pp > 1) continue;  // a tied head is refused under --pp
          SCOPED_TRACE(fmt::format("{} {} shards of {} bytes, tp {} pp {}", c.describe(),
                                   dtype_name(dtype), shard_bytes, lay.tp, lay.pp));
          const fs::path dir = fresh(root, "dir");
          write_by_layout(dir, w, lay, files, pool);
          for (const std::string& f : names)
            EXPECT_TRUE(slurp(dir / f) == slurp(ref / f)) << f << " differs from one process's";
        }
      }
}

// LayoutFiles::Writer in parts (what an offloaded optimizer's save does: each piece of the
// master weights and of each state tensor as it streams out of its file): pieces of 1,000
// elements, which cut GPT-2's transposed rows anywhere, give the same files as whole ranges.
TEST(LayoutCheckpoint, WrittenInPiecesTheFilesAreTheSame) {
  for (const bool gpt : {true, false}) {
    const ModelConfig whole = gpt ? gpt2() : llama();
    MemoryPool pool;
    const Whole w(whole, DType::f32, pool);
    testing::ScratchDir root;
    const fs::path ref = fresh(root, "ref");
    w.save(ref, kDefaultMaxShardBytes);
    const LayoutFiles files(whole, DType::f32, w.opt.get(), kDefaultMaxShardBytes);
    const fs::path dir = fresh(root, "dir");
    files.create(dir);
    const Tensor staging = Tensor::empty(pool, {7}, DType::f32, Category::staging, "staging");
    for (const auto& [c, t] : ranks(whole, {2, 1})) {
      const Tensor weights = slice_of(w.weights, c, t, pool);
      std::vector<Tensor> state;
      for (auto& [n, s] : w.opt->state()) state.push_back(slice_of(s, c, t, pool));
      const std::vector<SliceRun> runs = first_holder_runs(c, t);
      const int64_t total = ParamLayout(c).total();
      LayoutFiles::Writer out(files, dir, staging);
      for (int64_t a = 0; a < total; a += 1000) {
        const ElementRange piece{a, std::min(total, a + 1000)};
        out.weights(runs_within(runs, piece),
                    static_cast<const float*>(weights.raw_data()) + piece.begin, piece.begin);
      }
      ASSERT_EQ(files.state_count(), state.size());
      for (size_t s = 0; s < state.size(); ++s)
        for (int64_t a = 0; a < total; a += 1000) {
          const ElementRange piece{a, std::min(total, a + 1000)};
          out.state(s, runs_within(runs, piece),
                    static_cast<const float*>(state[s].raw_data()) + piece.begin, piece.begin);
        }
      out.finish();
    }
    for (const std::string& f : files.files())
      EXPECT_TRUE(slurp(dir / f) == slurp(ref / f)) << f << " differs from one process's";
  }
}

TEST(LayoutCheckpoint, EveryRankLoadsItsPartOfTheState) {
  const ModelConfig c = llama();
  MemoryPool pool;
  const Whole w(c, DType::f32, pool);
  testing::ScratchDir root;
  const fs::path ref = fresh(root, "ref");
  w.save(ref, kDefaultMaxShardBytes);
  const auto whole_opt = make_optimizer(adamw(c), w.layout, nullptr, ElementRange{0, 0});
  for (const Layout lay : std::vector<Layout>{{1, 1}, {2, 1}, {4, 1}, {2, 2}, {1, 4}})
    for (const auto& [local, t] : ranks(c, lay)) {
      const ParamLayout layout(local);
      const int64_t half = layout.total() / 2 / 16 * 16;
      for (const ElementRange mine : {ElementRange{0, half}, ElementRange{half, layout.total()}}) {
        auto o = make_optimizer(adamw(local), layout, &pool, mine);
        load_optimizer_state_by_layout(ref, *o, *whole_opt, whole_layout_runs(local, t));
        EXPECT_EQ(o->steps_taken(), 7);
        const auto want = w.opt->state();
        const auto got = o->state();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const Tensor expected = slice_of(want[i].second, local, t, pool);
          EXPECT_EQ(std::memcmp(got[i].second.raw_data(),
                                static_cast<const float*>(expected.raw_data()) + mine.begin,
                                got[i].second.nbytes()),
                    0)
              << "tp " << lay.tp << " pp " << lay.pp << " rank " << t << " " << got[i].first;
        }
      }
    }
}

// The save the trainer makes over a layout: the ranks' files staged beside DIR, then moved into
// rank 0's atomic save with config.json. `die_at`: a crash (the process exits) at that stage.
void save_by_layout(const fs::path& dir, const Whole& w, const LayoutFiles& files, MemoryPool& pool,
                    std::optional<SaveStage> die_at = std::nullopt) {
  const fs::path staging = fs::path(dir).concat(".zero-staging");
  fs::remove_all(staging);
  fs::create_directories(staging);
  write_by_layout(staging, w, {2, 1}, files, pool);
  CheckpointSaveOptions so;
  so.sharded_weights_dtype = DType::f32;
  so.write_extra = [&](const fs::path& tmp) { files.move(staging, tmp); };
  if (die_at)
    so.on_stage = [&](SaveStage s) {
      if (s == *die_at) _exit(9);
    };
  save_checkpoint(dir, w.config, w.layout, Tensor{}, so);
  fs::remove(staging);
}

TEST(LayoutCheckpoint, AKilledSaveLeavesACompleteCheckpoint) {
  const ModelConfig c = gpt2();
  MemoryPool pool;
  const Whole old(c, DType::f32, pool);
  Whole next(c, DType::f32, pool);
  fill_params(next.weights, c, next.layout, 99);
  next.opt->set_steps_taken(8);
  const LayoutFiles old_files(c, DType::f32, old.opt.get(), kDefaultMaxShardBytes);
  const LayoutFiles next_files(c, DType::f32, next.opt.get(), kDefaultMaxShardBytes);
  testing::ScratchDir root;
  const fs::path dir = root / "ck";
  save_by_layout(dir, old, old_files, pool);
  const std::string old_model = slurp(dir / kModelFile), old_opt = slurp(dir / kOptimizerFile);
  const fs::path ref = fresh(root, "ref");
  next.save(ref, kDefaultMaxShardBytes);
  const std::string new_model = slurp(ref / kModelFile), new_opt = slurp(ref / kOptimizerFile);
  ASSERT_NE(old_model, new_model);
  auto in_child = [&](const std::function<void()>& f) {
    const pid_t pid = fork();
    if (pid == 0) {
      try {  // never back into the test: the child ends here, whatever happens
        f();
      } catch (const std::exception& e) {
        fprintf(stderr, "child: %s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 9) << "the child did not crash as asked";
  };
  // A writer killed with the files laid out and only some parts written: DIR is untouched.
  in_child([&] {
    const fs::path staging = fs::path(dir).concat(".zero-staging");
    fs::remove_all(staging);
    fs::create_directories(staging);
    next_files.create(staging);
    _exit(9);
  });
  EXPECT_EQ(locate_checkpoint(dir).dir, dir);
  EXPECT_TRUE(slurp(dir / kModelFile) == old_model);
  EXPECT_TRUE(slurp(dir / kOptimizerFile) == old_opt);
  // A crash at every stage of the save that follows: the checkpoint found is the old or the
  // new one, whole (its weights and state of the same save).
  for (const SaveStage stage :
       {SaveStage::temp_created, SaveStage::model_written, SaveStage::files_written,
        SaveStage::old_moved_aside, SaveStage::new_in_place, SaveStage::old_removed}) {
    SCOPED_TRACE(std::string(save_stage_name(stage)));
    in_child([&] { save_by_layout(dir, next, next_files, pool, stage); });
    const CheckpointLocation at = locate_checkpoint(dir);
    const std::string model = slurp(at.dir / kModelFile), opt = slurp(at.dir / kOptimizerFile);
    const bool is_old = model == old_model && opt == old_opt;
    const bool is_new = model == new_model && opt == new_opt;
    EXPECT_TRUE(is_old || is_new);
    // The next save (of the old state, so every stage starts from it) tidies up.
    save_by_layout(dir, old, old_files, pool);
    EXPECT_TRUE(slurp(dir / kModelFile) == old_model);
  }
  EXPECT_EQ(testing::list_dir(root.path()), (std::vector<std::string>{"ck", "ref"}));
}

// A LLaMA whose slices cut whole 8-bit blocks at tp 2 and whole 4-bit blocks at tp 4 (its
// attention output's 512 columns over 4 ranks are runs of 128: not whole 8-bit blocks), key/value
// heads replicated at tp 4, a vocabulary --tp pads.
ModelConfig wide_llama() {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.d_model = 512;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_dim = 1024;
  c.vocab_size = 520;
  c.finalize();
  return c;
}

OptimConfig optim_named(const std::string& name, const ModelConfig& c) {
  OptimConfig o;
  o.name = name;
  o.n_head = c.n_head;
  return o;
}

// Every optimizer's real state (two steps of one process from random weights and gradients),
// loaded by every rank of every layout whose slices its blocks allow (each rank's range cut in
// two where the state allows, as ZeRO cuts it) and written back by the same ranks: one
// process's optimizer.safetensors and model.safetensors, byte for byte. A tied GPT-2's stages
// (the last stage's copy of the table loads the table's state and writes nothing). The layouts
// the blocks do not allow are refused by layout_state_refusal, naming the state.
TEST(LayoutCheckpoint, EveryOptimizersStateLoadsAndSavesBackAtEveryLayout) {
  for (const bool gpt : {false, true})
    for (const char* name : {"adamw8bit", "lion8bit", "adamw4bit", "adam-mini", "lion", "sgd",
                             "apollo", "apollo-mini", "galore", "galore8bit"}) {
      const ModelConfig c = gpt ? gpt2() : wide_llama();
      const OptimConfig o = optim_named(name, c);
      MemoryPool pool;
      const ParamLayout layout(c);
      Tensor weights = Tensor::empty(pool, {layout.total()}, DType::f32, Category::master, "w");
      Tensor grads = Tensor::empty(pool, {layout.total()}, DType::f32, Category::grads, "g");
      fill_params(weights, c, layout, 3);
      const auto opt = make_optimizer(o, layout, &pool);
      for (uint32_t step = 0; step < 2; ++step) {
        fill_params(grads, c, layout, 10 + step);
        opt->step(weights, grads, 1e-2f, 1.0f);
      }
      testing::ScratchDir root;
      const fs::path ref = fresh(root, "ref");
      save_weights(ref, c, layout, weights, WeightsSaveOptions{});
      save_optimizer_state(ref / kOptimizerFile, *opt);
      const auto whole_opt = make_optimizer(o, layout, nullptr, ElementRange{0, 0});
      whole_opt->set_steps_taken(opt->steps_taken());
      const LayoutFiles files(c, DType::f32, whole_opt.get(), kDefaultMaxShardBytes);
      const Tensor staging = Tensor::empty(pool, {7}, DType::f32, Category::staging, "staging");
      for (const Layout lay : std::vector<Layout>{{2, 1}, {4, 1}, {1, 2}, {2, 2}}) {
        if (gpt && lay.tp > 1) continue;  // gpt2-tiny's 96-wide slices cut every block size
        SCOPED_TRACE(fmt::format("{} {}, tp {} pp {}", c.describe(), name, lay.tp, lay.pp));
        const auto rs = ranks(c, lay);
        if (lay.tp > 1 && sliced_optimizer_refusal(o, rs.front().first)) {
          // 8-bit state at tp 4 (runs of 128), or a projection of a slice: refused up front.
          EXPECT_TRUE(layout_state_refusal(o, rs.front().first).has_value() || is_apollo(name) ||
                      is_galore(name));
          continue;
        }
        EXPECT_EQ(layout_state_refusal(o, rs.front().first), std::nullopt);
        const fs::path dir = fresh(root, "dir");
        files.create(dir);
        for (const auto& [local, t] : rs) {
          const ParamLayout rl(local);
          const Tensor mine_weights = slice_of(weights, local, t, pool);
          const int64_t cut = std::min(
              rl.total(), make_optimizer(o, rl, nullptr, ElementRange{0, 0})->next_cut(rl.total() / 2));
          for (const ElementRange mine : {ElementRange{0, cut}, ElementRange{cut, rl.total()}}) {
            if (mine.empty()) continue;
            const auto r = make_optimizer(o, rl, &pool, mine);
            load_optimizer_state_by_layout(ref, *r, *whole_opt, whole_layout_runs(local, t));
            EXPECT_EQ(r->steps_taken(), 2);
            const std::vector<SliceRun> runs = runs_within(first_holder_runs(local, t), mine);
            files.write(dir, runs, mine_weights.raw_data(), 0,
                        save_state_parts(*r, *whole_opt, runs), staging);
          }
        }
        for (const std::string_view f : {kOptimizerFile, kModelFile})
          EXPECT_TRUE(slurp(dir / f) == slurp(ref / f)) << f << " differs from one process's";
      }
    }
}

}  // namespace
}  // namespace memfit::io
