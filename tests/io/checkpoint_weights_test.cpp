// A checkpoint's weights read by range (open_checkpoint_weights, ParamSource::read_range): what
// a ZeRO rank's --init-from and --resume read. From model.safetensors, from Hugging Face's
// shards with an index, and from a ZeRO-sharded save's shard files (which has no
// model.safetensors), any range gives the bits the whole load gives those elements (transposed
// Conv1D weights, bf16 stored, padding rows zero, gaps zero); load_checkpoint reads a sharded save
// whole; a checkpoint of another model is refused naming the field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/checkpoint_export.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/hf/model_hf_config.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/optim/optimizer.h"
#include "memfit/state/shard.h"
#include "checkpoint_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

using namespace memfit::io::testing;
namespace fs = std::filesystem;

ModelConfig config_of(const char* preset) {
  ModelConfig c = ModelConfig::preset(preset);
  c.vocab_size = 500;  // padding rows
  if (c.family == Family::llama) c.tie_embeddings = false;  // an lm_head.weight too
  c.finalize();
  return c;
}

// Writes `slab` as a ZeRO-sharded save of `world` ranks: config.json, each rank's shard file
// (its range of the weights and its AdamW state slices) and zero_shards.json; no
// model.safetensors.
void save_sharded(const fs::path& dir, const ModelConfig& c, const ParamLayout& layout,
                  const Tensor& slab, int world, MemoryPool& pool) {
  fs::create_directories(dir);
  OptimConfig oc;
  StateOptions stage_one;
  stage_one.zero = 1;
  const StatePlacement placement(layout, oc, stage_one, {0, world});
  const std::vector<ElementRange>& shards = placement.shards();
  std::unique_ptr<Optimizer> last;
  for (int r = 0; r < world; ++r) {
    const ElementRange& s = shards[static_cast<size_t>(r)];
    last = make_optimizer(oc, layout, &pool, s);
    save_zero_shard(dir / zero_shard_file(r, world), *last, slab.view(s.begin, {s.size()}));
  }
  write_file_atomic(dir / kZeroIndexFile, zero_index_json(*last, placement));
  write_file_atomic(dir / "config.json", model_config_to_hf_json(c, slab.dtype()).dump(2));
}

TEST(CheckpointWeights, AnyRangeReadsWhatTheWholeLoadReadsFromEveryForm) {
  std::mt19937 cut(5);
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("{} {}", preset, dtype_name(dtype)));
      ScratchDir root;
      const ModelConfig c = config_of(preset);
      const ParamLayout layout(c);
      MemoryPool pool;
      Tensor slab = make_slab(pool, layout, dtype);
      fill(slab, 3);
      save_checkpoint(root / "one", c, layout, slab);
      CheckpointSaveOptions so;
      so.max_shard_bytes = 60'000;
      save_checkpoint(root / "hf-shards", c, layout, slab, so);
      save_sharded(root / "zero", c, layout, slab, 3, pool);
      ASSERT_TRUE(fs::exists(root / "hf-shards" / "model.safetensors.index.json"));
      ASSERT_FALSE(has_model_weights(root / "zero"));

      // The reference: the whole load of model.safetensors into an f32 slab.
      Tensor whole = make_slab(pool, layout, DType::f32);
      whole.zero();
      load_checkpoint(root / "one", c, layout, whole);
      std::vector<bool> in_param(static_cast<size_t>(layout.total()), false);
      for (const ParamInfo& p : layout.params())
        std::fill(in_param.begin() + p.offset, in_param.begin() + p.offset + p.numel, true);

      for (const char* form : {"one", "hf-shards", "zero"}) {
        SCOPED_TRACE(form);
        const auto source = open_checkpoint_weights(root / form, c);
        std::vector<ElementRange> ranges = {{0, layout.total()}, {0, 1},
                                            {layout.total() - 1, layout.total()}};
        for (int k = 0; k < 12; ++k) {
          int64_t a = std::uniform_int_distribution<int64_t>(0, layout.total())(cut);
          int64_t b = std::uniform_int_distribution<int64_t>(0, layout.total())(cut);
          ranges.push_back({std::min(a, b), std::max(a, b)});
        }
        for (const ElementRange& r : ranges) {
          std::vector<float> got(static_cast<size_t>(r.size()), -7.0f);
          source->read_range(r, got.data());
          int64_t differ = 0;
          for (int64_t i = r.begin; i < r.end; ++i) {
            const float want = in_param[static_cast<size_t>(i)] ? whole.data<float>()[i] : 0.0f;
            if (std::memcmp(&want, &got[static_cast<size_t>(i - r.begin)], 4) != 0) ++differ;
          }
          EXPECT_EQ(differ, 0) << "[" << r.begin << ", " << r.end << ")";
        }
      }

      // load_checkpoint reads a sharded save whole, into either dtype, as it reads the file.
      for (DType into : {DType::f32, DType::bf16}) {
        Tensor a = make_slab(pool, layout, into), b = make_slab(pool, layout, into);
        a.zero();
        b.zero();
        load_checkpoint(root / "one", c, layout, a);
        load_checkpoint(root / "zero", c, layout, b);
        expect_loaded(c, layout, a, b);
      }
      // It has no optimizer.safetensors: an optimizer to load with it is refused.
      OptimConfig oc;
      auto opt = make_optimizer(oc, layout, &pool);
      Tensor b = make_slab(pool, layout, DType::f32);
      EXPECT_THROW(load_checkpoint(root / "zero", c, layout, b, opt.get()), IoError);
    }
  }
}

// Given the config.json a caller read once (ReadCheckpoint, as a resumed run has it), the loads
// check the model against it and never read the file again: spoilt after the read, every form
// still loads the same bits; another model is refused with the same message as from the file.
TEST(CheckpointWeights, AConfigReadOnceIsNotReadAgain) {
  ScratchDir root;
  const ModelConfig c = config_of("llama-tiny");
  const ParamLayout layout(c);
  MemoryPool pool;
  Tensor slab = make_slab(pool, layout);
  fill(slab, 6);
  save_checkpoint(root / "one", c, layout, slab);
  save_sharded(root / "zero", c, layout, slab, 2, pool);
  ModelConfig other = c;
  other.n_layer += 1;
  other.finalize();
  for (const char* form : {"one", "zero"}) {
    SCOPED_TRACE(form);
    const ReadCheckpoint saved = read_checkpoint(root / form);
    EXPECT_EQ(saved.dir, root / form);
    EXPECT_TRUE(config_differences(saved.config, c).empty());
    const std::string from_file =
        error_of([&] { open_checkpoint_weights(root / form, other); });
    write_file_atomic(root / form / "config.json", "not json");
    Tensor back = make_slab(pool, layout);
    back.zero();
    load_checkpoint(saved, c, layout, back);
    expect_loaded(c, layout, slab, back);
    std::vector<float> got(static_cast<size_t>(layout.total()), -7.0f);
    open_checkpoint_weights(saved, c)->read_range({0, layout.total()}, got.data());
    EXPECT_EQ(std::memcmp(got.data(), back.data<float>(), got.size() * 4), 0);
    EXPECT_EQ(error_of([&] { open_checkpoint_weights(saved, other); }), from_file);
    EXPECT_EQ(error_of([&] { load_checkpoint(saved, other, layout, back); }), from_file);
    EXPECT_THROW(read_checkpoint(root / form), IoError);  // the file is spoilt indeed
  }
}

TEST(CheckpointWeights, AnotherModelOrAMissingShardIsRefusedNamingIt) {
  ScratchDir root;
  const ModelConfig c = config_of("gpt2-tiny");
  const ParamLayout layout(c);
  MemoryPool pool;
  Tensor slab = make_slab(pool, layout);
  fill(slab, 4);
  save_sharded(root / "zero", c, layout, slab, 2, pool);
  ModelConfig other = c;
  other.n_layer += 1;
  other.finalize();
  expect_contains(error_of([&] { open_checkpoint_weights(root / "zero", other); }),
                  {"config.json", "n_layer"});
  fs::remove(root / "zero" / zero_shard_file(1, 2));
  expect_contains(error_of([&] { open_checkpoint_weights(root / "zero", c); }),
                  {"zero-rank-00001-of-00002.safetensors is missing"});
  fs::remove_all(root / "zero");
  fs::create_directories(root / "empty");
  write_file_atomic(root / "empty" / "config.json", model_config_to_hf_json(c, DType::f32).dump());
  expect_contains(error_of([&] { open_checkpoint_weights(root / "empty", c); }),
                  {"no model.safetensors", "zero_shards.json"});
}

}  // namespace
}  // namespace memfit::io
