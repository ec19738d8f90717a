// LoRA adapters in PEFT's format (io/checkpoint/lora_adapter.h): a save holds PEFT's tensor
// names and shapes and an adapter_config.json PEFT reads; loading it back gives the same bits;
// a directory whose rank, alpha or targets differ from the run's is refused, naming both.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

ModelConfig tiny_llama() {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.ffn_dim = 48;
  c.max_seq_len = 8;
  c.vocab_size = 64;
  c.finalize();
  return c;
}

TEST(LoraAdapter, SavesPeftNamesAndConfigAndLoadsTheSameBits) {
  testing::ScratchDir dir;
  MemoryPool pool;
  const ModelConfig c = tiny_llama();
  LoraOptions o;
  o.rank = 4;
  o.alpha = 8;
  o.targets = "q,v";
  const LoraLayout layout(c, o);
  Tensor slab = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "a");
  layout.init(slab, 3);
  for (int64_t i = 0; i < slab.numel(); ++i) slab.data<float>()[i] += 0.001f * float(i % 7);
  save_lora_adapter(dir.path(), c, layout, slab);

  SafetensorsReader r(dir / kAdapterModelFile);
  EXPECT_EQ(r.entries().size(), 2u * 2 * 2);  // 2 layers, q and v, A and B
  const SafetensorsEntry& a =
      r.at("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 32}));
  const SafetensorsEntry& b =
      r.at("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{32, 4}));
  const nlohmann::json cfg = nlohmann::json::parse(read_file_to_string(dir / kAdapterConfigFile));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8.0);
  EXPECT_EQ(cfg["target_modules"], (nlohmann::json{"self_attn.q_proj", "self_attn.v_proj"}));
  EXPECT_EQ(cfg["fan_in_fan_out"], false);

  Tensor back = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "b");
  layout.init(back, 99);
  load_lora_adapter(dir.path(), c, layout, back);
  for (const ParamInfo& p : layout.param_layout().params())
    EXPECT_EQ(std::memcmp(back.view(p.offset, p.shape).raw_data(),
                          slab.view(p.offset, p.shape).raw_data(), p.numel * sizeof(float)),
              0)
        << p.name;

  LoraOptions other = o;
  other.rank = 8;
  const LoraLayout wider(c, other);
  Tensor w = Tensor::empty(pool, {wider.total()}, DType::f32, Category::params, "w");
  try {
    load_lora_adapter(dir.path(), c, wider, w);
    ADD_FAILURE() << "a rank-4 adapter loaded into rank 8";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("r is 4"), std::string::npos) << e.what();
  }
}

TEST(LoraAdapter, Gpt2ConfigSaysFanInFanOut) {
  testing::ScratchDir dir;
  MemoryPool pool;
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.max_seq_len = 8;
  c.vocab_size = 64;
  c.finalize();
  LoraOptions o;
  o.rank = 2;
  const LoraLayout layout(c, o);
  Tensor slab = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "a");
  layout.init(slab, 1);
  save_lora_adapter(dir.path(), c, layout, slab);
  const nlohmann::json cfg = nlohmann::json::parse(read_file_to_string(dir / kAdapterConfigFile));
  EXPECT_EQ(cfg["fan_in_fan_out"], true);
  EXPECT_EQ(cfg["target_modules"],
            (nlohmann::json{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  SafetensorsReader r(dir / kAdapterModelFile);
  EXPECT_EQ(r.at("base_model.model.transformer.h.0.mlp.c_fc.lora_B.weight").shape,
            (std::vector<int64_t>{64, 2}));
}

}  // namespace
}  // namespace memfit::io
