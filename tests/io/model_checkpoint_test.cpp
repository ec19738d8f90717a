// Checkpoints of both families beyond one file: sharded saves (N files and an index, atomic with
// the rest, loading back bit for bit), re-saves over a sharded checkpoint, a corrupt index
// refused with the slab untouched, and saves and loads under a pool budget that holds only the
// slabs and one tensor (streaming: no whole-file or whole-model copy).
// The single-file GPT-2 format: gpt2_checkpoint_test.cpp; LLaMA's: llama_checkpoint_test.cpp.
#include "memfit/io/checkpoint/model_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "checkpoint_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace testing;  // ScratchDir, list_dir; checkpoint_test_util.h

ModelConfig config_of(const char* preset, bool tied = false) {
  ModelConfig c = ModelConfig::preset(preset);
  c.vocab_size = 500;  // padding rows to drop and zero
  if (c.family == Family::llama) c.tie_embeddings = tied;
  c.finalize();
  return c;
}

uint64_t largest_stored_tensor(const ModelConfig& c, const ParamLayout& layout, DType dtype) {
  uint64_t n = 0;
  for (const ParamInfo& p : layout.params()) {
    uint64_t e = dtype_size(dtype);
    for (int64_t d : hf_param_shape(c, p)) e *= static_cast<uint64_t>(d);
    n = std::max(n, e);
  }
  return n;
}

TEST(ModelCheckpoint, ShardedSavesWriteNFilesAndAnIndexAndLoadBackBitForBit) {
  for (const char* preset : {"llama-tiny", "gpt2-tiny"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("{} {}", preset, dtype_name(dtype)));
      ScratchDir root;
      MemoryPool pool;
      ModelConfig c = config_of(preset);
      ParamLayout layout(c);
      Tensor slab = make_slab(pool, layout, dtype), back = make_slab(pool, layout, dtype);
      fill(slab, 1);
      fill(back, 2);
      CheckpointSaveOptions o;
      o.max_shard_bytes = 300'000 / dtype_size(DType::f32) * dtype_size(dtype);
      o.staging_pool = &pool;
      o.extra_files["trainer_state.json"] = "{}";
      save_checkpoint(root / "ckpt", c, layout, slab, o);

      json index =
          json::parse(read_file_to_string(root / "ckpt" / "model.safetensors.index.json"));
      std::vector<std::string> files;
      uint64_t total = 0;
      std::map<std::string, uint64_t> shard_bytes, shard_count;
      int last_shard = 0;
      for (const ParamInfo& p : layout.params()) {
        const std::string name = hf_param_name(c, p);
        ASSERT_TRUE(index["weight_map"].contains(name)) << name;
        const std::string file = index["weight_map"][name];
        const int k = std::stoi(file.substr(6, 5));
        EXPECT_GE(k, last_shard) << name << ": shards follow the layout order";
        last_shard = k;
        uint64_t n = hf_param_view(c, layout, slab, p).nbytes();
        total += n;
        shard_bytes[file] += n;
        ++shard_count[file];
        if (files.empty() || files.back() != file) files.push_back(file);
      }
      EXPECT_EQ(index["weight_map"].size(), layout.params().size());
      EXPECT_EQ(index["metadata"]["total_size"], total);
      const int n = static_cast<int>(files.size());
      EXPECT_GE(n, 3);
      for (int k = 0; k < n; ++k) EXPECT_EQ(files[k], shard_file_name(k + 1, n));
      for (const auto& [file, b] : shard_bytes)  // within the limit, or one tensor alone
        EXPECT_TRUE(b <= o.max_shard_bytes || shard_count[file] == 1) << file << " holds " << b;
      std::vector<std::string> expected = {"config.json", "model.safetensors.index.json",
                                           "trainer_state.json"};
      expected.insert(expected.end(), files.begin(), files.end());
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(list_dir(root / "ckpt"), expected);

      load_checkpoint(root / "ckpt", c, layout, back);
      expect_loaded(c, layout, slab, back);

      // Saving again over a sharded checkpoint (its marker is the index), now in one file: the
      // shards go with the old directory.
      fill(slab, 3);
      save_checkpoint(root / "ckpt", c, layout, slab);
      EXPECT_EQ(list_dir(root / "ckpt"),
                (std::vector<std::string>{"config.json", "model.safetensors"}));
      load_checkpoint(root / "ckpt", c, layout, back);
      expect_loaded(c, layout, slab, back);
      EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
    }
  }
}

TEST(ModelCheckpoint, AFailedShardedSaveKeepsTheOldCheckpoint) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = config_of("llama-tiny");
  ParamLayout layout(c);
  Tensor old_w = make_slab(pool, layout), new_w = make_slab(pool, layout);
  Tensor back = make_slab(pool, layout);
  fill(old_w, 4);
  fill(new_w, 5);
  CheckpointSaveOptions o;
  o.max_shard_bytes = 200'000;
  save_checkpoint(root / "ckpt", c, layout, old_w, o);
  const std::vector<std::string> before = list_dir(root / "ckpt");
  o.on_stage = [](SaveStage s) {
    if (s == SaveStage::model_written) throw std::runtime_error("injected");
  };
  EXPECT_THROW(save_checkpoint(root / "ckpt", c, layout, new_w, o), std::runtime_error);
  EXPECT_EQ(list_dir(root / "ckpt"), before);
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
  load_checkpoint(root / "ckpt", c, layout, back);
  expect_loaded(c, layout, old_w, back);
}

// Each corruption is refused before a byte of the slab (or the optimizer) changes.
TEST(ModelCheckpoint, ACorruptIndexIsRefusedWithTheSlabUntouched) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = config_of("llama-tiny", /*tied=*/true);
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout), back = make_slab(pool, layout);
  fill(slab, 6);
  fill(back, 7);
  const std::string untouched = bytes(back);
  CheckpointSaveOptions o;
  o.max_shard_bytes = 200'000;
  save_checkpoint(root / "good", c, layout, slab, o);
  const std::string index_text =
      read_file_to_string(root / "good" / "model.safetensors.index.json");
  const json index = json::parse(index_text);
  const std::string norm = "model.layers.1.input_layernorm.weight";
  const std::string norm_file = index["weight_map"][norm];

  auto copy_good = [&](const std::string& name) {
    fs::remove_all(root / name);
    fs::copy(root / "good", root / name);
    return root / name;
  };
  auto expect_refused = [&](const fs::path& dir, const std::vector<std::string>& needles) {
    std::string msg = error_of([&] { load_checkpoint(dir, c, layout, back); });
    expect_contains(msg, needles);
    EXPECT_EQ(bytes(back), untouched);
  };

  // A missing shard.
  fs::path d = copy_good("missing_file");
  fs::remove(d / norm_file);
  expect_refused(d, {"model.safetensors.index.json", norm_file + " does not exist"});

  // A tensor in two shards: the last shard also holds the first shard's norm.
  d = copy_good("duplicate");
  const std::string last_file = index["weight_map"]["model.norm.weight"];
  ASSERT_NE(last_file, norm_file);
  {
    SafetensorsReader r(root / "good" / last_file);
    SafetensorsWriter w;
    for (const SafetensorsEntry& e : r.entries())
      w.add_raw(e.name, e.dtype, e.shape, r.bytes(e));
    w.add(norm, layout.view(slab, norm));
    w.write(d / last_file);
  }
  expect_refused(d, {fmt::format("'{}' is in both {} and {}", norm, norm_file, last_file)});

  // A tensor the model needs that neither the index nor any file has.
  d = copy_good("missing_tensor");
  {
    json i = index;
    i["weight_map"].erase(norm);
    write_file_atomic(d / "model.safetensors.index.json", i.dump());
    SafetensorsReader r(root / "good" / norm_file);
    SafetensorsWriter w;
    for (const SafetensorsEntry& e : r.entries())
      if (e.name != norm) w.add_raw(e.name, e.dtype, e.shape, r.bytes(e));
    w.write(d / norm_file);
  }
  expect_refused(d, {"does not match the model", "1 mismatch:", "missing '" + norm + "' (96,)"});

  // A tensor the model does not have, listed and stored.
  d = copy_good("unexpected");
  {
    json i = index;
    i["weight_map"]["model.layers.9.input_layernorm.weight"] = norm_file;
    write_file_atomic(d / "model.safetensors.index.json", i.dump());
    SafetensorsReader r(root / "good" / norm_file);
    SafetensorsWriter w;
    for (const SafetensorsEntry& e : r.entries())
      w.add_raw(e.name, e.dtype, e.shape, r.bytes(e));
    w.add("model.layers.9.input_layernorm.weight", layout.view(slab, norm));
    w.write(d / norm_file);
  }
  expect_refused(d, {"unexpected 'model.layers.9.input_layernorm.weight' (96,) in " + norm_file});

  // Sanity: the good one loads.
  load_checkpoint(root / "good", c, layout, back);
  expect_loaded(c, layout, slab, back);
}

// The streaming guarantee, measured by the pool: a budget of the two slabs plus one tensor's
// stored bytes is enough to save (sharded or not, transposing GPT-2's Conv1D weights through
// staging) and to load (converting F32 <-> BF16 straight into the slab). A budget one tensor
// short of that fails the GPT-2 save with OutOfMemoryError: the staging is accounted.
TEST(ModelCheckpoint, SavesAndLoadsWithinSlabsPlusOneTensor) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("{} {}", preset, dtype_name(dtype)));
      ScratchDir root;
      ModelConfig c = config_of(preset);
      ParamLayout layout(c);
      const DType other = dtype == DType::f32 ? DType::bf16 : DType::f32;
      const size_t slabs = MemoryPool::round_up(layout.total() * dtype_size(dtype)) +
                           MemoryPool::round_up(layout.total() * dtype_size(other));
      const uint64_t largest = largest_stored_tensor(c, layout, dtype);
      MemoryPool pool(slabs + MemoryPool::round_up(largest));
      Tensor slab = make_slab(pool, layout, dtype), back = make_slab(pool, layout, other);
      fill(slab, 8);
      for (uint64_t shard : {kDefaultMaxShardBytes, uint64_t{100'000}}) {
        CheckpointSaveOptions o;
        o.max_shard_bytes = shard;
        o.staging_pool = &pool;
        save_checkpoint(root / "ckpt", c, layout, slab, o);
        load_checkpoint(root / "ckpt", c, layout, back);
      }
      EXPECT_LE(pool.bytes_peak(), pool.budget());
      EXPECT_LE(pool.bytes_peak(Category::staging), MemoryPool::round_up(largest));
      // GPT-2 transposes through staging; LLaMA writes every tensor straight from the slab.
      EXPECT_EQ(pool.bytes_peak(Category::staging) > 0, c.family == Family::gpt2);
      // The loaded model is the saved one, converted.
      for (const ParamInfo& p : layout.params()) {
        Tensor a = hf_param_view(c, layout, slab, p), b = hf_param_view(c, layout, back, p);
        int bad = 0;
        for (int64_t i = 0; i < a.numel(); ++i) {
          if (dtype == DType::f32)
            bad += static_cast<uint16_t*>(b.raw_data())[i] != bf16_from_f32(a.data<float>()[i]);
          else
            bad += b.data<float>()[i] != f32_from_bf16(static_cast<uint16_t*>(a.raw_data())[i]);
        }
        EXPECT_EQ(bad, 0) << p.name;
      }
    }
  }
  // One Conv1D weight's room short: the staging does not fit.
  ScratchDir root;
  ModelConfig c = config_of("gpt2-tiny");
  ParamLayout layout(c);
  MemoryPool pool(MemoryPool::round_up(layout.total() * 4) + 1024);
  Tensor slab = make_slab(pool, layout);
  CheckpointSaveOptions o;
  o.staging_pool = &pool;
  EXPECT_THROW(save_checkpoint(root / "ckpt", c, layout, slab, o), OutOfMemoryError);
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{});
}

}  // namespace
}  // namespace memfit::io
