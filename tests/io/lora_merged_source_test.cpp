// `memfit export --merge-lora`'s reading side (io/checkpoint/lora_merged_source.h, model/
// lora_merge.h): a LoRA model's base weights and adapters, saved as the trainer saves them, read
// back merged. Every adapted weight equals base + (alpha/r) B A computed here in double from the
// blocks' adapter views (row ranges of the fused q|k|v and gate|up layers: not the merge's own
// name matching), every other weight is the base's bit for bit, and the exported directory
// loaded as a plain model gives the LoRA model's logits. Also PEFT configs from elsewhere
// (["q_proj", "v_proj"]) and what memfit does not build (use_dora, rank_pattern) in
// read_lora_options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/checkpoint_export.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/lora_merged_source.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/model/lora_merge.h"
#include "memfit/model/transformer.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny(Family family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = family == Family::llama ? 2 : 4;
  c.d_model = 32;
  c.ffn_dim = family == Family::llama ? 48 : 0;
  c.max_seq_len = 16;
  c.vocab_size = 61;  // padded: the padding rows stay out of the merge and the export
  if (family == Family::llama) c.tie_embeddings = false;
  c.finalize();
  return c;
}

// Adapters with a random B (PEFT's initialisation has B = 0, which merges to the base).
void randomize(const Tensor& slab, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  for (int64_t i = 0; i < slab.numel(); ++i) slab.data<float>()[i] = u(rng);
}

class LoraMergedSource : public ::testing::TestWithParam<Family> {};

TEST_P(LoraMergedSource, MergedWeightsAreBasePlusScaledBAAndTheExportGivesTheLoraLogits) {
  testing::ScratchDir dir;
  MemoryPool pool;
  const ModelConfig c = tiny(GetParam());
  LoraOptions o;
  o.rank = 3;
  o.alpha = 5;
  o.targets = GetParam() == Family::llama ? "q,v,o,up,down" : "attn,fc,mlp_proj";
  Transformer m(c, pool);
  m.init_weights(11);
  m.add_lora(o, 5);
  randomize(m.lora_weights(), 7);
  const fs::path ck = dir / "ck", hf = dir / "hf";
  save_checkpoint(ck, c, m.layout(), m.weights());
  save_lora_adapter(ck, c, *m.lora(), m.lora_weights());

  std::unique_ptr<ParamSource> source = make_lora_merged_source(open_param_source(ck), ck, pool);
  const ParamLayout& layout = m.layout();
  Tensor merged = Tensor::empty(pool, {layout.total()}, DType::f32, Category::staging, "m");
  for (const ParamInfo& p : layout.params()) source->read(p, merged.view(p.offset, p.shape));

  // The expected weights, from the LoRA model's own views of its fused layers.
  const Tensor& base = m.weights();
  std::vector<double> want(static_cast<size_t>(layout.total()));
  std::vector<bool> adapted(want.size(), false);
  std::vector<double> size(want.size(), 0.0);  // |base| + scale sum |b a|: what rounding scales by
  for (int64_t i = 0; i < layout.total(); ++i) want[size_t(i)] = base.data<float>()[i];
  ModelWeights bw = layout.views(base);
  m.lora()->bind(bw, m.lora_weights());
  auto slot_weight = [&](const BlockWeights& b, int s) -> const Tensor& {
    switch (static_cast<LinearSlot>(s)) {
      case LinearSlot::qkv: return b.qkv_w;
      case LinearSlot::attn_out: return b.attn_out_w;
      case LinearSlot::fc: return b.fc_w;
      case LinearSlot::mlp_out: return b.mlp_out_w;
    }
    return b.qkv_w;
  };
  int adapters = 0;
  for (const BlockWeights& b : bw.blocks)
    for (int s = 0; s < kLinearSlots; ++s)
      for (const LoraView& v : b.lora[size_t(s)]) {
        if (!v.a.defined()) continue;
        ++adapters;
        const Tensor& w = slot_weight(b, s);
        const int64_t at = static_cast<const float*>(w.raw_data()) - base.data<float>();
        const int64_t in = w.size(1), r = v.a.size(0);
        for (int64_t i = 0; i < v.b.size(0); ++i)
          for (int64_t j = 0; j < in; ++j) {
            double d = 0, d_abs = 0;
            for (int64_t k = 0; k < r; ++k) {
              const double t =
                  double(v.b.data<float>()[i * r + k]) * double(v.a.data<float>()[k * in + j]);
              d += t;
              d_abs += std::abs(t);
            }
            const size_t e = size_t(at + (v.row0 + i) * in + j);
            want[e] += double(o.alpha) / o.rank * d;
            size[e] = std::abs(double(base.data<float>()[e])) + double(o.alpha) / o.rank * d_abs;
            adapted[e] = true;
          }
      }
  EXPECT_EQ(adapters, int(m.lora()->params().size()));
  int64_t changed = 0;
  double worst = 0;
  for (int64_t i = 0; i < layout.total(); ++i) {
    const float got = merged.data<float>()[i];
    if (!adapted[size_t(i)]) {
      ASSERT_EQ(std::memcmp(&got, base.data<float>() + i, 4), 0) << "element " << i;
      continue;
    }
    // Relative to the operands' size, as f32 rounding goes (the sum may cancel to near zero).
    worst = std::max(worst, std::abs(got - want[size_t(i)]) / (size[size_t(i)] + 1e-30));
    changed += got != base.data<float>()[i];
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(changed, 0);

  // The range reads (what --init-from of a ZeRO run reads) are the same merged values.
  Tensor ranged = Tensor::empty(pool, {layout.total()}, DType::f32, Category::staging, "r");
  source->read_range({0, layout.total()}, ranged.data<float>());
  for (const ParamInfo& p : layout.params())
    EXPECT_EQ(std::memcmp(ranged.view(p.offset, p.shape).raw_data(),
                          merged.view(p.offset, p.shape).raw_data(), p.numel * 4),
              0)
        << p.name;

  // The export, loaded as a plain model, computes the LoRA model's logits.
  export_hf(hf, *source);
  EXPECT_FALSE(has_lora_adapter(hf));
  Transformer plain(c, pool);
  load_checkpoint(hf, c, plain.layout(), plain.weights());
  const int B = 2, T = 16;
  m.reserve(B, T);
  plain.reserve(B, T);
  Tensor tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "t");
  for (int i = 0; i < B * T; ++i) tokens.data<int32_t>()[i] = (i * 7 + 3) % c.vocab_size;
  Tensor a = Tensor::empty(pool, {B, T, c.vocab_size}, DType::f32, Category::staging, "a");
  Tensor b = Tensor::empty(pool, {B, T, c.vocab_size}, DType::f32, Category::staging, "b");
  m.logits(tokens, a);
  plain.logits(tokens, b);
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - b.data<float>()[i];
    num += d * d;
    den += double(a.data<float>()[i]) * a.data<float>()[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  // ... and not the base model's: the adapters moved the logits.
  Transformer basem(c, pool);
  load_checkpoint(ck, c, basem.layout(), basem.weights());
  basem.reserve(B, T);
  basem.logits(tokens, b);
  num = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - b.data<float>()[i];
    num += d * d;
  }
  EXPECT_GT(std::sqrt(num / den), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraMergedSource,
                         ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

// A bf16 weight merges as the f32 one rounded once.
TEST(LoraMerge, ABf16WeightIsTheF32MergeRoundedOnce) {
  MemoryPool pool;
  const ModelConfig c = tiny(Family::llama);
  LoraOptions o;
  o.rank = 2;
  o.alpha = 4;
  const LoraLayout lora(c, o);
  Tensor adapters = Tensor::empty(pool, {lora.total()}, DType::f32, Category::staging, "a");
  randomize(adapters, 3);
  const ParamLayout layout(c);
  const ParamInfo& p = layout.find("model.layers.1.mlp.gate_proj.weight");
  Tensor f = Tensor::empty(pool, p.shape, DType::f32, Category::staging, "f");
  Tensor h = Tensor::empty(pool, p.shape, DType::bf16, Category::staging, "h");
  for (int64_t i = 0; i < f.numel(); ++i) {
    const uint16_t x = bf16_from_f32(0.01f * float(i % 13) - 0.05f);
    static_cast<uint16_t*>(h.raw_data())[i] = x;
    f.data<float>()[i] = f32_from_bf16(x);
  }
  EXPECT_EQ(lora_merge_param(c, lora, adapters, p, f), 1);
  EXPECT_EQ(lora_merge_param(c, lora, adapters, p, h), 1);
  for (int64_t i = 0; i < f.numel(); ++i)
    ASSERT_EQ(static_cast<uint16_t*>(h.raw_data())[i], bf16_from_f32(f.data<float>()[i])) << i;
  // The LM head and the norms are never adapted.
  EXPECT_EQ(lora_merge_param(c, lora, adapters, layout.find("lm_head.weight"),
                             Tensor::empty(pool, layout.find("lm_head.weight").shape, DType::f32,
                                           Category::staging, "x")),
            0);
}

void write_config(const fs::path& dir, const nlohmann::json& j) {
  fs::create_directories(dir);
  write_file_atomic(dir / kAdapterConfigFile, j.dump());
}

TEST(LoraAdapterConfig, PeftTargetModulesFromElsewhereReadAsMemfitTargets) {
  testing::ScratchDir dir;
  nlohmann::json j = {{"peft_type", "LORA"}, {"r", 8}, {"lora_alpha", 16},
                      {"lora_dropout", 0.05}, {"target_modules", {"q_proj", "v_proj"}},
                      {"bias", "none"}, {"use_rslora", false}, {"rank_pattern", nlohmann::json::object()}};
  write_config(dir.path(), j);
  LoraOptions o = read_lora_options(dir.path(), tiny(Family::llama));
  EXPECT_EQ(o.rank, 8);
  EXPECT_EQ(o.alpha, 16.0f);
  EXPECT_EQ(o.targets, "q,v");
  EXPECT_EQ(o.dropout, 0.0f);
  j["target_modules"] = {"c_proj"};  // PEFT's suffix match: both of GPT-2's c_proj layers
  write_config(dir.path(), j);
  EXPECT_EQ(read_lora_options(dir.path(), tiny(Family::gpt2)).targets, "proj,mlp_proj");
  j["target_modules"] = {"c_attn", "c_proj", "c_fc"};
  write_config(dir.path(), j);
  EXPECT_EQ(read_lora_options(dir.path(), tiny(Family::gpt2)).targets, "all-linear");

  auto refused = [&](nlohmann::json bad, Family f, const char* needle) {
    write_config(dir.path(), bad);
    try {
      read_lora_options(dir.path(), tiny(f));
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  nlohmann::json bad = j;
  bad["target_modules"] = {"q_proj", "lm_head"};
  refused(bad, Family::llama, "'lm_head' is none of llama's adapted layers");
  bad = j;
  bad["use_dora"] = true;
  refused(bad, Family::gpt2, "use_dora");
  bad = j;
  bad["rank_pattern"] = {{"q_proj", 4}};
  refused(bad, Family::gpt2, "rank_pattern");
  bad = j;
  bad["target_modules"] = ".*proj";
  refused(bad, Family::gpt2, "regular expression");
  bad = j;
  bad.erase("r");
  refused(bad, Family::gpt2, "no r");
}

}  // namespace
}  // namespace memfit::io
