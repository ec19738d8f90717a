// ZeRO's sharded optimizer state (io/checkpoint/zero_checkpoint.h) without MPI: a whole-layout
// state, cut into the shards of one world size and saved a file per rank, loads into the ranges of
// another world size (and into the whole layout) as exactly the whole state's slices, for
// optimizers whose state is per element, per 256-value block (8-bit) and per Adam-mini block; what
// does not fit is refused naming the file, with the optimizer untouched.
#include "memfit/io/checkpoint/zero_checkpoint.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/optim/optimizer.h"
#include "memfit/state/shard.h"
#include "memfit/state/state_placement.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;

// "adamw:bf16" is AdamW with --optim-state-dtype bf16.
OptimConfig optim(const std::string& name, const ModelConfig& mc) {
  OptimConfig c;
  c.name = name;
  if (name == "adamw:bf16") {
    c.name = "adamw";
    c.state_dtype = DType::bf16;
  }
  c.n_head = mc.n_head;
  c.seed = 7;
  return c;
}

ModelConfig tiny() {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.finalize();
  return c;
}

// Every state tensor of `opt` (a whole-layout optimizer) filled with random bytes.
void fill_random(Optimizer& opt, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& [n, t] : opt.state()) {
    auto* b = static_cast<unsigned char*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(rng());
  }
}

// Whether `part`'s state is `whole`'s slices at its range's extents, byte for byte.
bool is_slice_of(const Optimizer& part, const Optimizer& whole) {
  const auto ext = part.state_extents(part.range());
  const auto w = whole.state();
  const auto p = part.state();
  size_t k = 0;
  for (size_t i = 0; i < ext.size(); ++i) {
    if (ext[i].empty()) continue;
    const Tensor& a = p.at(k++).second;
    const Tensor& b = w.at(i).second;
    const size_t es = dtype_size(a.dtype());
    if (std::memcmp(a.raw_data(), static_cast<const std::byte*>(b.raw_data()) + ext[i].begin * es,
                    a.nbytes()) != 0)
      return false;
  }
  return true;
}

// Saves `whole`'s state as `world` shards into dir (the files and the index, as the trainer).
void save_shards(const fs::path& dir, const OptimConfig& oc, const ParamLayout& layout,
                 const Optimizer& whole, int world, MemoryPool& pool) {
  // The trainer's placement of a stage-1 run over `world` ranks (one rank: stage 0, one shard).
  StateOptions stage_one;
  stage_one.zero = 1;
  const StatePlacement placement(layout, oc, stage_one, {0, world});
  const std::vector<ElementRange>& shards = placement.shards();
  EXPECT_EQ(shards, shard_ranges(layout, oc, world));
  std::unique_ptr<Optimizer> last;
  for (int r = 0; r < world; ++r) {
    auto o = make_optimizer(oc, layout, &pool, shards[static_cast<size_t>(r)]);
    const auto ext = o->state_extents(o->range());
    const auto w = whole.state();
    size_t k = 0;
    for (auto& [n, t] : o->state()) {
      while (ext[k].empty()) ++k;
      const size_t es = dtype_size(t.dtype());
      std::memcpy(t.raw_data(),
                  static_cast<const std::byte*>(w[k].second.raw_data()) + ext[k].begin * es,
                  t.nbytes());
      ++k;
    }
    o->set_steps_taken(whole.steps_taken());
    ASSERT_TRUE(is_slice_of(*o, whole));
    const Tensor weights =
        Tensor::empty(pool, {o->range().size()}, DType::f32, Category::master, "weights");
    save_zero_shard(dir / zero_shard_file(r, world), *o, weights);
    last = std::move(o);
  }
  const std::string index = zero_index_json(*last, placement);
  // The index names the placement's stage and world size.
  EXPECT_NE(index.find(fmt::format("\"zero\": {}", world > 1 ? 1 : 0)), std::string::npos)
      << index;
  EXPECT_NE(index.find(fmt::format("\"world_size\": {}", world)), std::string::npos) << index;
  write_file_atomic(dir / kZeroIndexFile, index);
}

TEST(ZeroCheckpoint, ShardsLoadIntoAnyOtherWorldSizeAsTheWholeStatesSlices) {
  const ModelConfig mc = tiny();
  const ParamLayout layout(mc);
  for (const char* name :
       {"adamw", "adamw8bit", "adam-mini", "adamw:bf16", "adamw4bit", "apollo-mini", "galore",
        "galore8bit"}) {
    SCOPED_TRACE(name);
    const OptimConfig oc = optim(name, mc);
    MemoryPool pool;
    auto whole = make_optimizer(oc, layout, &pool);
    fill_random(*whole, 11);
    whole->set_steps_taken(5);
    for (int from : {1, 2, 3, 4}) {
      testing::ScratchDir dir;
      save_shards(dir.path(), oc, layout, *whole, from, pool);
      for (int to : {1, 2, 3, 4}) {
        for (const ElementRange& r : shard_ranges(layout, oc, to)) {
          auto o = make_optimizer(oc, layout, &pool, r);
          load_optimizer_state_any(dir.path(), *o);
          EXPECT_TRUE(is_slice_of(*o, *whole)) << from << " -> " << to << " ranks";
          EXPECT_EQ(o->steps_taken(), 5);
        }
      }
      auto w = make_optimizer(oc, layout, &pool);
      load_optimizer_state_any(dir.path(), *w);
      EXPECT_TRUE(is_slice_of(*w, *whole)) << from << " -> the whole layout";
    }
  }
}

// A whole-layout optimizer.safetensors (a stage-0 save) loads into any range.
TEST(ZeroCheckpoint, AWholeOptimizerFileLoadsIntoAnyRange) {
  const ModelConfig mc = tiny();
  const ParamLayout layout(mc);
  const OptimConfig oc = optim("adamw8bit", mc);
  MemoryPool pool;
  auto whole = make_optimizer(oc, layout, &pool);
  fill_random(*whole, 3);
  whole->set_steps_taken(9);
  testing::ScratchDir dir;
  save_optimizer_state(dir / std::string(kOptimizerFile), *whole);
  for (const ElementRange& r : shard_ranges(layout, oc, 3)) {
    auto o = make_optimizer(oc, layout, &pool, r);
    load_optimizer_state_any(dir.path(), *o);
    EXPECT_TRUE(is_slice_of(*o, *whole));
    EXPECT_EQ(o->steps_taken(), 9);
  }
}

// Another optimizer, a missing shard file, or a tensor cut short: an IoError naming the file,
// and the optimizer's state as it was.
TEST(ZeroCheckpoint, WhatDoesNotFitIsRefusedNamingTheFile) {
  const ModelConfig mc = tiny();
  const ParamLayout layout(mc);
  const OptimConfig oc = optim("adamw", mc);
  MemoryPool pool;
  auto whole = make_optimizer(oc, layout, &pool);
  fill_random(*whole, 5);
  testing::ScratchDir dir;
  save_shards(dir.path(), oc, layout, *whole, 2, pool);
  auto expect_refused = [&](const OptimConfig& c, const std::string& needle) {
    auto o = make_optimizer(c, layout, &pool);
    fill_random(*o, 99);
    auto before = make_optimizer(c, layout, &pool);
    fill_random(*before, 99);
    try {
      load_optimizer_state_any(dir.path(), *o);
      ADD_FAILURE() << "not refused: " << needle;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(is_slice_of(*o, *before)) << "the state changed";
  };
  expect_refused(optim("lion", mc), "holds 'adamw' optimizer state; this run uses 'lion'");
  fs::remove(dir / zero_shard_file(1, 2));
  expect_refused(oc, zero_shard_file(1, 2) + " is missing");
}

}  // namespace
}  // namespace memfit::io
