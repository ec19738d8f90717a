// LLaMA checkpoints: round trips in f32 and bf16, tied and untied; Hugging Face's names and
// torch.nn.Linear shapes with no transposes and no padding rows; a hand-made Hugging Face style
// directory (bf16, sharded, with an index) loads; a tied head that differs is refused; a
// checkpoint of another shape or family is refused by its config.json.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/hf/llama_hf_config.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "checkpoint_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace testing;  // ScratchDir, list_dir; checkpoint_test_util.h

// llama-tiny with a vocabulary that leaves padding rows (500 -> 512).
ModelConfig llama(bool tied, int n_kv_head = 2) {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.vocab_size = 500;
  c.tie_embeddings = tied;
  c.n_kv_head = n_kv_head;
  c.finalize();
  return c;
}

TEST(LlamaCheckpoint, RoundTripsF32AndBf16TiedAndUntied) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool tied : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), tied ? "tied" : "untied"));
      ScratchDir root;
      MemoryPool pool;
      ModelConfig c = llama(tied);
      ParamLayout layout(c);
      Tensor slab = make_slab(pool, layout, dtype), back = make_slab(pool, layout, dtype);
      fill(slab, 1);
      fill(back, 2);
      save_checkpoint(root / "ckpt", c, layout, slab);
      EXPECT_EQ(list_dir(root / "ckpt"),
                (std::vector<std::string>{"config.json", "model.safetensors"}));
      EXPECT_EQ(read_checkpoint_config(root / "ckpt"), c);
      load_checkpoint(root / "ckpt", c, layout, back);
      expect_loaded(c, layout, slab, back);
    }
  }
}

TEST(LlamaCheckpoint, StoresHuggingFaceNamesAndLinearShapesWithoutTransposes) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = llama(false);
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout);
  fill(slab, 3);
  save_checkpoint(root / "ckpt", c, layout, slab);
  SafetensorsReader r(root / "ckpt" / "model.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.entries().size(), layout.params().size());
  const int64_t C = c.d_model, hs = c.head_size(), F = c.ffn_dim;
  auto shape = [&](const std::string& n) { return r.at(n).shape; };
  EXPECT_EQ(shape("model.embed_tokens.weight"), (std::vector<int64_t>{500, C}));
  EXPECT_EQ(shape("lm_head.weight"), (std::vector<int64_t>{500, C}));
  EXPECT_EQ(shape("model.norm.weight"), (std::vector<int64_t>{C}));
  EXPECT_EQ(shape("model.layers.1.input_layernorm.weight"), (std::vector<int64_t>{C}));
  EXPECT_EQ(shape("model.layers.1.post_attention_layernorm.weight"), (std::vector<int64_t>{C}));
  EXPECT_EQ(shape("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{4 * hs, C}));
  EXPECT_EQ(shape("model.layers.0.self_attn.k_proj.weight"), (std::vector<int64_t>{2 * hs, C}));
  EXPECT_EQ(shape("model.layers.0.self_attn.v_proj.weight"), (std::vector<int64_t>{2 * hs, C}));
  EXPECT_EQ(shape("model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{C, 4 * hs}));
  EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{F, C}));
  EXPECT_EQ(shape("model.layers.0.mlp.up_proj.weight"), (std::vector<int64_t>{F, C}));
  EXPECT_EQ(shape("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{C, F}));
  // Stored exactly as the slab holds them: [out, in] is memfit's layout too.
  for (const ParamInfo& p : layout.params()) {
    Tensor v = hf_param_view(c, layout, slab, p);
    EXPECT_EQ(std::memcmp(r.bytes(r.at(p.name)), v.raw_data(), v.nbytes()), 0) << p.name;
  }
  json j = json::parse(read_file_to_string(root / "ckpt" / "config.json"));
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["vocab_size"], 500);

  // Tied: no lm_head.weight, as transformers' save_pretrained writes it.
  ModelConfig t = llama(true);
  ParamLayout lt(t);
  Tensor st = make_slab(pool, lt);
  save_checkpoint(root / "tied", t, lt, st);
  SafetensorsReader rt(root / "tied" / "model.safetensors");
  EXPECT_EQ(rt.find("lm_head.weight"), nullptr);
  EXPECT_EQ(rt.entries().size(), lt.params().size());
}

// A Hugging Face style directory written by hand: bf16 tensors in three shards of our choosing,
// an index, the rotary buffers older saves include, and a tied lm_head equal to the embedding.
void write_hf_directory(const fs::path& dir, const ModelConfig& c, const ParamLayout& layout,
                        const Tensor& slab, bool with_head) {
  fs::create_directories(dir);
  std::vector<SafetensorsWriter> shards(3);
  json weight_map = json::object();
  const std::vector<std::string> files = {"model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors"};
  auto put = [&](int k, const std::string& name, const Tensor& t) {
    shards[k].add(name, t, DType::bf16);
    weight_map[name] = files[k];
  };
  for (const ParamInfo& p : layout.params())
    put(p.layer < 0 ? 0 : 1 + p.layer % 2, p.name, hf_param_view(c, layout, slab, p));
  if (with_head) put(2, "lm_head.weight", hf_param_view(c, layout, slab, layout.params()[0]));
  Tensor inv_freq = layout.view(slab, "model.norm.weight").slice(0, c.head_size() / 2);
  put(1, "model.layers.0.self_attn.rotary_emb.inv_freq", inv_freq);
  for (size_t k = 0; k < shards.size(); ++k) {
    shards[k].set_metadata("format", "pt");
    shards[k].write(dir / files[k]);
  }
  json index = {{"metadata", {{"total_size", 12345}}}, {"weight_map", weight_map}};
  write_file_atomic(dir / "model.safetensors.index.json", index.dump(2));
  json config = llama_config_to_hf_json(c, DType::bf16);
  config["bos_token_id"] = 1;
  config["transformers_version"] = "4.46.0";
  write_file_atomic(dir / "config.json", config.dump(2));
}

TEST(LlamaCheckpoint, LoadsAHandMadeShardedBf16HuggingFaceDirectory) {
  ScratchDir root;
  MemoryPool pool;
  for (bool tied : {false, true}) {
    ModelConfig c = llama(tied);
    ParamLayout layout(c);
    Tensor f32 = make_slab(pool, layout), b16 = make_slab(pool, layout, DType::bf16);
    fill(f32, 4);
    const fs::path dir = root / (tied ? "tied" : "untied");
    write_hf_directory(dir, c, layout, f32, tied);
    EXPECT_EQ(read_checkpoint_config(dir), c);

    // Into a bf16 model: the stored bits, exactly.
    Tensor back = make_slab(pool, layout, DType::bf16);
    fill(back, 5);
    load_checkpoint(dir, c, layout, back);
    // What the file holds, rounded as the writer rounds.
    for (int64_t i = 0; i < f32.numel(); ++i)
      static_cast<uint16_t*>(b16.raw_data())[i] = bf16_from_f32(f32.data<float>()[i]);
    expect_loaded(c, layout, b16, back);

    // Into an f32 model: the same values, widened exactly.
    Tensor wide = make_slab(pool, layout);
    load_checkpoint(dir, c, layout, wide);
    Tensor q = layout.view(wide, "model.layers.1.self_attn.q_proj.weight");
    Tensor q16 = layout.view(b16, "model.layers.1.self_attn.q_proj.weight");
    for (int64_t i = 0; i < q.numel(); ++i)
      ASSERT_EQ(q.data<float>()[i], f32_from_bf16(static_cast<uint16_t*>(q16.raw_data())[i]));
  }
}

TEST(LlamaCheckpoint, ATiedHeadThatDiffersFromTheEmbeddingIsRefused) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig c = llama(true);
  ParamLayout layout(c);
  Tensor slab = make_slab(pool, layout), back = make_slab(pool, layout);
  fill(slab, 6);
  SafetensorsWriter w;
  for (const ParamInfo& p : layout.params()) w.add(p.name, hf_param_view(c, layout, slab, p));
  Tensor other = Tensor::empty(pool, {c.vocab_size, c.d_model}, DType::f32, Category::params, "o");
  w.add("lm_head.weight", other);
  w.write(root / "untied.safetensors");
  std::string msg = error_of([&] { load_weights(root / "untied.safetensors", c, layout, back); });
  expect_contains(msg, {"untied.safetensors", "'lm_head.weight' differs from "
                                              "'model.embed_tokens.weight'",
                        "tie_word_embeddings"});
  EXPECT_EQ(bytes(back), std::string(back.nbytes(), '\0'));

  // An untied model needs its head.
  ModelConfig u = llama(false);
  ParamLayout lu(u);
  Tensor su = make_slab(pool, lu);
  save_weights_file(root / "tied.safetensors", c, layout, slab);
  msg = error_of([&] { load_weights(root / "tied.safetensors", u, lu, su); });
  expect_contains(msg, {"1 mismatch:", "missing 'lm_head.weight' (500, 96)"});
}

TEST(LlamaCheckpoint, RefusesACheckpointOfAnotherShapeOrFamily) {
  ScratchDir root;
  MemoryPool pool;
  ModelConfig a = llama(false, 2), b = llama(false, 4);
  ParamLayout la(a), lb(b);
  Tensor sa = make_slab(pool, la), sb = make_slab(pool, lb);
  save_checkpoint(root / "ckpt", a, la, sa);
  std::string msg = error_of([&] { load_checkpoint(root / "ckpt", b, lb, sb); });
  expect_contains(msg, {"config.json", "num_key_value_heads is 2 there, 4 here"});
  // The weights alone say which tensors differ.
  msg = error_of([&] { load_weights(root / "ckpt", b, lb, sb); });
  expect_contains(msg, {"'model.layers.0.self_attn.k_proj.weight' has shape (48, 96), expected "
                        "(96, 96)"});

  ModelConfig g = ModelConfig::preset("gpt2-tiny");
  ParamLayout lg(g);
  Tensor sg = make_slab(pool, lg);
  msg = error_of([&] { load_checkpoint(root / "ckpt", g, lg, sg); });
  expect_contains(msg, {"the model is llama there, gpt2 here"});
  EXPECT_EQ(bytes(sg), std::string(sg.nbytes(), '\0'));
}

}  // namespace
}  // namespace memfit::io
