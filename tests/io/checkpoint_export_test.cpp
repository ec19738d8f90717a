// memfit export --hf, as a library: a checkpoint exported (one file or shards) loads back bit
// for bit, with config.json and nothing of the optimizer; it converts to bf16 on the way out;
// it holds one parameter at a time (the pool's peak is the largest parameter plus the writer's
// staging, far below the model); and another reader reads the files (tests/reference/
// read_hf_export.py, Python's standard library).
#include "memfit/io/checkpoint/checkpoint_export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/hf/model_hf_config.h"
#include "memfit/io/hf/model_weights.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/optim/optimizer.h"
#include "checkpoint_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

using namespace memfit::io::testing;
using nlohmann::json;
namespace fs = std::filesystem;

ModelConfig config_of(const char* preset) {
  ModelConfig c = ModelConfig::preset(preset);
  c.vocab_size = 500;  // padding rows the export drops
  if (c.family == Family::llama) c.tie_embeddings = false;  // an lm_head.weight too
  c.finalize();
  return c;
}

// The largest parameter as the slab holds it (padding rows included).
size_t largest_param(const ParamLayout& layout, DType dtype) {
  size_t n = 0;
  for (const ParamInfo& p : layout.params())
    n = std::max(n, static_cast<size_t>(p.shape.numel()) * dtype_size(dtype));
  return n;
}

TEST(CheckpointExport, ExportsLoadBackBitForBitOneTensorAtATime) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("{} {}", preset, dtype_name(dtype)));
      ScratchDir root;
      const ModelConfig c = config_of(preset);
      const ParamLayout layout(c);
      MemoryPool model_pool;
      Tensor slab = make_slab(model_pool, layout, dtype), back = make_slab(model_pool, layout, dtype);
      fill(slab, 3);
      OptimConfig oc;
      std::unique_ptr<Optimizer> opt = make_optimizer(oc, layout, model_pool);
      CheckpointSaveOptions so;
      so.optimizer = opt.get();
      so.extra_files["trainer_state.json"] = "{}";
      save_checkpoint(root / "ck", c, layout, slab, so);

      for (uint64_t shard : {kDefaultMaxShardBytes, uint64_t{60'000}}) {
        MemoryPool pool;
        ExportOptions eo;
        eo.max_shard_bytes = shard;
        eo.pool = &pool;
        auto source = open_param_source(root / "ck");
        EXPECT_EQ(source->dtype(), dtype);
        const std::vector<std::string> files = export_hf(root / "hf", *source, eo);
        const std::vector<std::string> listed = list_dir(root / "hf");
        EXPECT_EQ(std::count(listed.begin(), listed.end(), "config.json"), 1);
        EXPECT_EQ(std::count(listed.begin(), listed.end(), "optimizer.safetensors"), 0);
        EXPECT_EQ(std::count(listed.begin(), listed.end(), "trainer_state.json"), 0);
        EXPECT_EQ(std::count(listed.begin(), listed.end(), "model.safetensors.index.json"),
                  shard == kDefaultMaxShardBytes ? 0 : 1);
        EXPECT_EQ(listed.size(), files.size());
        fill(back, 9);
        load_checkpoint(root / "hf", c, layout, back);
        expect_loaded(c, layout, slab, back);
        // One parameter and the writer's staging (at most one stored tensor) at a time.
        const size_t bound = MemoryPool::round_up(largest_param(layout, dtype)) * 2;
        EXPECT_LE(pool.bytes_peak(), bound);
        EXPECT_LT(pool.bytes_peak(), slab.nbytes() / 2);
        EXPECT_EQ(pool.bytes_current(), 0u);
      }
    }
  }
}

TEST(CheckpointExport, ConvertsToBf16OnTheWayOut) {
  ScratchDir root;
  const ModelConfig c = config_of("llama-tiny");
  const ParamLayout layout(c);
  MemoryPool pool;
  Tensor slab = make_slab(pool, layout, DType::f32), back = make_slab(pool, layout, DType::bf16);
  fill(slab, 5);
  save_checkpoint(root / "ck", c, layout, slab);
  ExportOptions eo;
  eo.dtype = DType::bf16;
  auto source = open_param_source(root / "ck");
  export_hf(root / "hf", *source, eo);
  EXPECT_EQ(json::parse(read_file_to_string(root / "hf" / "config.json"))["torch_dtype"],
            "bfloat16");
  load_checkpoint(root / "hf", c, layout, back);
  int bad = 0;
  for (const ParamInfo& p : layout.params()) {
    Tensor a = hf_param_view(c, layout, slab, p), b = hf_param_view(c, layout, back, p);
    for (int64_t i = 0; i < a.numel(); ++i)
      bad += static_cast<uint16_t*>(b.raw_data())[i] != bf16_from_f32(a.data<float>()[i]);
  }
  EXPECT_EQ(bad, 0);
}

TEST(CheckpointExport, ACheckpointThatDoesNotFitItsConfigIsRefusedBeforeWriting) {
  ScratchDir root;
  const ModelConfig c = config_of("gpt2-tiny");
  const ParamLayout layout(c);
  MemoryPool pool;
  Tensor slab = make_slab(pool, layout);
  save_checkpoint(root / "ck", c, layout, slab);
  ModelConfig other = c;
  other.n_layer += 1;
  other.finalize();
  write_file_atomic(root / "ck" / "config.json", model_config_to_hf_json(other).dump());
  expect_contains(error_of([&] { open_param_source(root / "ck"); }), {fmt::format("missing 'transformer.h.{}.", c.n_layer)});
  EXPECT_FALSE(fs::exists(root / "hf"));
}

// A checkpoint in pieces of the flat slab, one per "rank" (how ZeRO's sharded saves store it),
// cut at points that split parameters: the export assembles each parameter from the pieces it
// spans and loads back bit for bit; pieces that do not tile the slab are refused.
TEST(CheckpointExport, AssemblesParametersFromPiecesOfTheSlab) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    ScratchDir root;
    const ModelConfig c = config_of(preset);
    const ParamLayout layout(c);
    MemoryPool pool;
    Tensor slab = make_slab(pool, layout), back = make_slab(pool, layout);
    fill(slab, 11);
    const int64_t n = layout.total();
    const std::vector<int64_t> cuts = {0, n / 3 + 7, n / 3 + 8, 2 * n / 3 - 5, n};  // one of 1
    std::vector<std::unique_ptr<SafetensorsReader>> files;
    std::vector<SlabPiece> pieces;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
      const fs::path file = root / fmt::format("rank{}.safetensors", r);
      SafetensorsWriter w;
      w.add("slab", slab.view(cuts[r], {cuts[r + 1] - cuts[r]}));
      w.write(file);
      files.push_back(std::make_unique<SafetensorsReader>(file));
      const SafetensorsReader* f = files.back().get();
      const int64_t begin = cuts[r];
      pieces.push_back({cuts[r], cuts[r + 1], [f, begin](int64_t from, int64_t to, void* dst) {
                          std::memcpy(dst, f->bytes(f->at("slab")) + (from - begin) * 4,
                                      static_cast<size_t>(to - from) * 4);
                        }});
    }
    auto source = make_slab_pieces_source(c, DType::f32, pieces, "4 pieces");
    ExportOptions eo;
    eo.max_shard_bytes = 60'000;
    export_hf(root / "hf", *source, eo);
    load_checkpoint(root / "hf", c, layout, back);
    expect_loaded(c, layout, slab, back);

    pieces.pop_back();
    EXPECT_THROW(make_slab_pieces_source(c, DType::f32, pieces, "3 pieces"), ConfigError);
  }
}

// An independent reader (tests/reference/read_hf_export.py: Python's standard library, as a
// loader without transformers reads safetensors) reads the export: every tensor, its shape and
// dtype, and its values (float64 sums).
TEST(CheckpointExport, PythonReadsTheExport) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    ScratchDir root;
    const ModelConfig c = config_of(preset);
    const ParamLayout layout(c);
    MemoryPool pool;
    Tensor slab = make_slab(pool, layout, DType::bf16);
    fill(slab, 7);
    save_checkpoint(root / "ck", c, layout, slab);
    ExportOptions eo;
    eo.max_shard_bytes = 60'000;
    auto source = open_param_source(root / "ck");
    export_hf(root / "hf", *source, eo);
    const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/reference/read_hf_export.py '{}' > '{}'",
                                        MEMFIT_SOURCE_DIR, (root / "hf").string(),
                                        (root / "py.json").string());
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    const json py = json::parse(read_file_to_string(root / "py.json"));
    EXPECT_EQ(py["config"]["vocab_size"], c.vocab_size);
    EXPECT_EQ(py["tensors"].size(), layout.params().size());
    for (const ParamInfo& p : layout.params()) {
      const std::string name = hf_param_name(c, p);
      ASSERT_TRUE(py["tensors"].contains(name)) << name;
      const json& t = py["tensors"][name];
      EXPECT_EQ(t["dtype"], "BF16") << name;
      EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), hf_param_shape(c, p)) << name;
      Tensor v = hf_param_view(c, layout, slab, p);
      double sum = 0;
      for (int64_t i = 0; i < v.numel(); ++i)
        sum += f32_from_bf16(static_cast<uint16_t*>(v.raw_data())[i]);
      EXPECT_NEAR(t["sum"].get<double>(), sum, 1e-9 * (1 + std::abs(sum))) << name;
    }
  }
}

}  // namespace
}  // namespace memfit::io
