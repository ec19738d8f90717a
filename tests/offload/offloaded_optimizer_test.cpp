// The streamed update against the same optimizer in RAM (Note [NVMe offload]): for every
// optimizer, with FP32 weights in RAM and with FP32 master weights on disk, both I/O engines,
// several steps on changing gradients: the weights (and the rounded working copy) and the
// optimizer state, saved as optimizer.safetensors, are the same bytes; loading the saved state
// into a fresh offloaded optimizer continues identically.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/streamed_weights.h"
#include "memfit/offload/offloaded_optimizer.h"
#include "memfit/optim/optim_config.h"
#include "memfit/state/shard.h"
#include "../io/io_test_util.h"
#include "../support/scoped_env.h"
#include "offload_test_util.h"

namespace memfit::offload {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string optim;
  bool master;
};

class OffloadedOptimizerTest : public ::testing::TestWithParam<std::tuple<Case, std::string>> {};

TEST_P(OffloadedOptimizerTest, StepsBitIdenticalToRam) {
  const auto& [c, engine] = GetParam();
  const test::ScopedEnv env("MEMFIT_OFFLOAD_IO", engine);
  TempDir tmp;
  const ModelConfig mc = llama();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.name = c.optim;
  if (oc.name == "adamw-bf16-state") {  // --optim-state-dtype bf16
    oc.name = "adamw";
    oc.state_dtype = DType::bf16;
  }
  oc.n_head = mc.n_head;
  oc.seed = 11;
  const int64_t n = layout.total();
  MemoryPool pool;
  Tensor w_ram = Tensor::empty(pool, {n}, DType::f32, Category::master, "w");
  Tensor h_ram = Tensor::empty(pool, {n}, DType::bf16, Category::params, "h");
  Tensor h_off = Tensor::empty(pool, {n}, DType::bf16, Category::params, "h");
  Tensor w_off = Tensor::empty(pool, {n}, DType::f32, Category::params, "w");  // no master
  Tensor grads = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
  fill(w_ram, 1, 1.0f);
  std::memcpy(w_off.raw_data(), w_ram.raw_data(), w_ram.nbytes());
  auto ram = make_optimizer(oc, layout, pool);
  // The thread engine's runs also cut the units into pieces of at most 3000 elements (cut where
  // the state allows), so many pieces pass through the ring.
  const int64_t piece = engine == "threads" ? 3000 : kMaxPieceElements;
  auto off =
      std::make_unique<OffloadedOptimizer>(oc, layout, c.master, pool, tmp.path, "t", piece);
  // (adamw4bit cuts only between matrices, so its pieces are whole matrices and fewer.)
  if (engine == "threads") {
    EXPECT_GT(off->file_layout().pieces.size(), c.optim == "adamw4bit" ? 10u : 20u);
  }
  if (c.master) off->write_master(w_ram);
  auto step_both = [&](int t) {
    fill(grads, 100 + t, 0.2f);
    if (c.master) {
      ram->step_master(w_ram, h_ram, grads, 1e-2f, 0.7f);
      off->step(h_off, grads, 1e-2f, 0.7f);
    } else {
      ram->step(w_ram, grads, 1e-2f, 0.7f);
      off->step(w_off, grads, 1e-2f, 0.7f);
    }
  };
  auto expect_same = [&](const char* when) {
    if (c.master) {
      EXPECT_TRUE(same_bytes(h_ram, h_off)) << when;
      Tensor back = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "back");
      off->read_master(back);
      EXPECT_TRUE(same_bytes(w_ram, back)) << when;
    } else {
      EXPECT_TRUE(same_bytes(w_ram, w_off)) << when;
    }
    io::save_optimizer_state(tmp.path / "ram.safetensors", *ram);
    off->save_state(tmp.path / "off.safetensors");
    EXPECT_EQ(first_difference(tmp.path / "ram.safetensors", tmp.path / "off.safetensors"), "")
        << when;
  };
  for (int t = 0; t < 3; ++t) step_both(t);
  expect_same("after 3 steps");
  EXPECT_EQ(off->steps_taken(), 3);
  // A fresh offloaded optimizer from the saved state continues as RAM does.
  const fs::path saved = tmp.path / "saved.safetensors";
  off->save_state(saved);
  Tensor master_copy = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "copy");
  if (c.master) off->read_master(master_copy);
  off.reset();
  off = std::make_unique<OffloadedOptimizer>(oc, layout, c.master, pool, tmp.path, "u", piece);
  if (c.master) off->write_master(master_copy);
  off->load_state(saved);
  EXPECT_EQ(off->steps_taken(), 3);
  for (int t = 3; t < 5; ++t) step_both(t);
  expect_same("after a reload and 2 more steps");
  EXPECT_GT(off->stats().bytes_read, 0u);
  EXPECT_GT(off->stats().bytes_written, 0u);
  EXPECT_EQ(off->engine().name(), engine == "threads" ? "threads" : "io_uring");
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, std::string>>& info) {
  const auto& [c, engine] = info.param;
  std::string n = c.optim + (c.master ? "_master" : "_fp32") + "_" + engine;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OffloadedOptimizerTest,
    ::testing::Combine(::testing::Values(Case{"adamw", false}, Case{"adamw", true},
                                         Case{"adamw8bit", false}, Case{"adamw8bit", true},
                                         Case{"lion", true}, Case{"lion8bit", true},
                                         Case{"adam-mini", false}, Case{"adam-mini", true},
                                         Case{"sgd", true}, Case{"adamw4bit", false},
                                         Case{"adamw4bit", true},
                                         Case{"adamw-bf16-state", true}, Case{"apollo", false},
                                         Case{"apollo-mini", true}, Case{"galore", false},
                                         Case{"galore8bit", true}),
                       ::testing::Values(std::string("uring"), std::string("threads"))),
    case_name);

// A ZeRO rank's shard offloaded (Note [Model state]): three ranks' ranges, each its own
// OffloadedOptimizer over its slices, update exactly as the whole layout does in RAM.
TEST(OffloadedOptimizer, ShardsStepAsTheWholeLayoutInRam) {
  TempDir tmp;
  const ModelConfig mc = llama();
  const ParamLayout layout(mc);
  const int64_t n = layout.total();
  for (const char* name : {"adamw8bit", "adam-mini", "apollo-mini", "galore8bit"}) {
    SCOPED_TRACE(name);
    OptimConfig oc;
    oc.name = name;
    oc.n_head = mc.n_head;
    MemoryPool pool;
    Tensor w = Tensor::empty(pool, {n}, DType::f32, Category::master, "w");
    Tensor h_ram = Tensor::empty(pool, {n}, DType::bf16, Category::params, "h");
    Tensor h_off = Tensor::empty(pool, {n}, DType::bf16, Category::params, "h");
    Tensor grads = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
    fill(w, 3, 1.0f);
    auto ram = make_optimizer(oc, layout, pool);
    std::vector<std::unique_ptr<OffloadedOptimizer>> shards;
    for (const ElementRange& r : shard_ranges(layout, oc, 3)) {
      shards.push_back(std::make_unique<OffloadedOptimizer>(
          oc, layout, true, pool, tmp.path, fmt::format("rank{}", shards.size()), 5000, r));
      shards.back()->write_master(w.view(r.begin, {r.size()}));
    }
    for (int t = 0; t < 3; ++t) {
      fill(grads, 200 + t, 0.2f);
      ram->step_master(w, h_ram, grads, 1e-2f, 0.9f);
      for (auto& s : shards) {
        const ElementRange r = s->range();
        Tensor h = h_off.view(r.begin, {r.size()});
        s->step(h, grads.view(r.begin, {r.size()}), 1e-2f, 0.9f);
      }
    }
    EXPECT_TRUE(same_bytes(h_ram, h_off));
    Tensor back = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "back");
    for (auto& s : shards) {
      Tensor part = back.view(s->range().begin, {s->range().size()});
      s->read_master(part);
    }
    EXPECT_TRUE(same_bytes(w, back));
    EXPECT_THROW(shards[1]->save_state(tmp.path / "x.safetensors"), Error);
  }
}

// What a streamed save reads (Note [Streamed save]): the master weights of any range, piece
// by piece in order, each run the overlap of a piece with the range; and model.safetensors
// streamed from the master file, with pieces of 3000 elements cut mid-row of GPT-2's
// transposed Conv1D weights, is the save of the same weights from RAM, shards included.
TEST(OffloadedOptimizer, TheMasterWeightsOfARangeStreamIntoTheSaveFromRam) {
  TempDir tmp;
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.vocab_size = 500;  // padding rows the save drops
  mc.finalize();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.name = "adamw8bit";
  oc.n_head = mc.n_head;
  MemoryPool pool;
  const int64_t n = layout.total();
  Tensor w = Tensor::empty(pool, {n}, DType::f32, Category::master, "w");
  fill(w, 5, 1.0f);
  OffloadedOptimizer off(oc, layout, true, pool, tmp.path, "t", 3000);
  ASSERT_GT(off.file_layout().pieces.size(), 20u);
  off.write_master(w);
  for (const ElementRange want : {ElementRange{0, n}, ElementRange{123, 45678},
                                  ElementRange{3001, 3002}, ElementRange{n - 5, n}}) {
    SCOPED_TRACE(fmt::format("[{}, {})", want.begin, want.end));
    int64_t at = want.begin;
    int runs = 0;
    off.read_master_range(want, [&](int64_t from, int64_t to, const float* src) {
      EXPECT_EQ(from, at);
      EXPECT_LT(from, to);
      EXPECT_EQ(std::memcmp(src, w.data<float>() + from, static_cast<size_t>(to - from) * 4), 0);
      at = to;
      ++runs;
    });
    EXPECT_EQ(at, want.end);
    EXPECT_GE(runs, 1);
  }
  for (const uint64_t max_shard : {io::kDefaultMaxShardBytes, uint64_t{300000}}) {
    SCOPED_TRACE(max_shard);
    fs::remove_all(tmp.path / "ram");
    fs::remove_all(tmp.path / "off");
    fs::create_directories(tmp.path / "ram");
    fs::create_directories(tmp.path / "off");
    io::WeightsSaveOptions o;
    o.max_shard_bytes = max_shard;
    const auto files = io::save_weights(tmp.path / "ram", mc, layout, w, o);
    io::StreamedWeights s;
    s.dtype = DType::f32;
    s.stream = [&](ElementRange range, const io::RecordTake& take) {
      off.read_master_range(range, [&](int64_t from, int64_t to, const float* src) {
        take(from, to, src);
      });
    };
    s.staging = Tensor::empty(pool, {1000}, DType::f32, Category::staging, "save.staging");
    EXPECT_EQ(io::save_weights_streamed(tmp.path / "off", mc, layout, s, o), files);
    if (max_shard == io::kDefaultMaxShardBytes)
      EXPECT_EQ(files.size(), 1u);
    else
      EXPECT_GT(files.size(), 3u);  // shards and the index
    for (const std::string& f : files)
      EXPECT_EQ(first_difference(tmp.path / "ram" / f, tmp.path / "off" / f), "") << f;
  }
}

TEST(OffloadedOptimizer, FilesHaveHeadersAndGoAway) {
  TempDir tmp;
  const ModelConfig mc = llama();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.n_head = mc.n_head;
  MemoryPool pool;
  fs::path master_file;
  {
    OffloadedOptimizer off(oc, layout, true, pool, tmp.path, "run-x");
    ASSERT_EQ(off.files().size(), 3u);  // master, m, v
    master_file = off.files()[0]->path();
    const nlohmann::json h = ScratchFile::read_header(master_file);
    EXPECT_EQ(h["run"], "run-x");
    EXPECT_EQ(h["tensor"], "master");
    EXPECT_EQ(h["optimizer"], "adamw");
    EXPECT_EQ(h["layout"]["elements"], layout.total());
    EXPECT_EQ(h["step"], 0);
    EXPECT_EQ(fs::file_size(master_file), off.file_layout().tensors[0].file_bytes);
    off.set_steps_taken(7);
    EXPECT_EQ(ScratchFile::read_header(master_file)["step"], 7);
    // The ring is the staging the layout says, from the pool.
    EXPECT_EQ(pool.bytes_current(Category::staging), off.file_layout().staging_bytes());
  }
  EXPECT_FALSE(fs::exists(master_file));
  EXPECT_EQ(pool.bytes_current(Category::staging), 0u);
}

// A 7B model's optimizer files have thousands of pieces: the header names them by count and
// digest (cut_points), so it stays within its page (the list itself did not: llama2-7b's 8-bit
// state header was 9,246 bytes).
TEST(OffloadedOptimizer, AHeaderOfThousandsOfPiecesFitsItsPage) {
  TempDir tmp;
  const ParamLayout layout(llama());
  OptimConfig oc;
  oc.n_head = llama().n_head;
  MemoryPool pool;
  const int64_t piece = 64;
  ASSERT_GT(layout.total() / piece, 2000);
  OffloadedOptimizer off(oc, layout, true, pool, tmp.path, "many", piece);
  const nlohmann::json h = ScratchFile::read_header(off.files()[0]->path());
  EXPECT_EQ(h["layout"]["piece_starts"]["count"], off.file_layout().pieces.size());
  std::vector<int64_t> starts;
  for (const ElementRange& u : off.file_layout().pieces) starts.push_back(u.begin);
  EXPECT_EQ(h["layout"]["piece_starts"], cut_points(starts));
  starts.back() += 1;
  EXPECT_NE(cut_points(starts)["fnv1a"], h["layout"]["piece_starts"]["fnv1a"]);
}

TEST(OffloadedOptimizer, RefusesADiskTooSmallWithTheNumbers) {
  // Llama 2 7B's width 80 blocks deep: about 16B parameters, 200 GB of master weights and AdamW
  // moments; twice as deep, and again, until the files outgrow the temporary directory's free
  // space, so the refusal is checked on a machine of any disk (a skip on a large one hid it).
  TempDir tmp;
  ModelConfig mc = ModelConfig::preset("llama2-7b");
  OptimConfig oc;
  oc.n_head = mc.n_head;
  std::optional<ParamLayout> layout;
  OffloadLayout files;
  for (mc.n_layer = 80;; mc.n_layer *= 2) {
    mc.finalize();
    layout.emplace(mc);
    files = make_offload_layout(*layout, oc, true);
    if (files.disk_total() > free_disk_bytes(tmp.path)) break;
  }
  MemoryPool pool;
  try {
    OffloadedOptimizer off(oc, *layout, true, pool, tmp.path, "big");
    FAIL() << "a disk too small was accepted";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("needs {} bytes", files.disk_total())), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
    EXPECT_NE(m.find(tmp.path.string()), std::string::npos) << m;
  }
  EXPECT_TRUE(fs::is_empty(tmp.path));
  EXPECT_EQ(pool.bytes_current(), 0u);
}

}  // namespace
}  // namespace memfit::offload
