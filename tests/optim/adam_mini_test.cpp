// Adam-mini over a whole layout: the partition (counted by role and checked segment by segment)
// and three steps against a double-precision Adam-mini whose blocks are derived independently,
// element by element, from each parameter's role and shape.
#include "memfit/optim/adam_mini.h"

#include <gtest/gtest.h>

#include <map>

#include "optim_test_util.h"

namespace memfit {
namespace {

// Block id of element k of parameter p under Note [Adam-mini partition], written per element
// rather than per segment: query/key by head, value and linear weights by row, embeddings by
// row, LayerNorm whole, linear biases per element.
int64_t block_of(const ParamInfo& p, int64_t k, int n_head) {
  switch (p.role) {
    case ParamRole::attn_qkv_weight: {
      const int64_t C = p.shape[1], row = k / C, hs = C / n_head;
      return row < 2 * C ? row / hs : 2 * n_head + (row - 2 * C);
    }
    case ParamRole::attn_q_weight:
    case ParamRole::attn_k_weight:  // LLaMA: per head of hs rows (GQA's k has fewer heads)
      return k / p.shape[1] / (p.shape[1] / n_head);
    case ParamRole::token_embedding:
    case ParamRole::position_embedding:
    case ParamRole::lm_head:
    case ParamRole::attn_v_weight:
    case ParamRole::attn_proj_weight:
    case ParamRole::mlp_fc_weight:
    case ParamRole::mlp_gate_weight:
    case ParamRole::mlp_up_weight:
    case ParamRole::mlp_proj_weight:
      return k / p.shape[1];
    case ParamRole::norm_weight:
    case ParamRole::norm_bias:
      return 0;
    case ParamRole::linear_bias:
      return k;
  }
  return -1;
}

TEST(AdamMini, PartitionFollowsHeadsRowsAndTensors) {
  ModelConfig gc = ModelConfig::preset("gpt2-tiny");  // C 96, 4 heads of 24, 2 layers
  ParamLayout layout(gc);
  const int64_t C = gc.d_model, H = gc.n_head, L = gc.n_layer;
  // wte rows + wpe rows + per layer (ln 2 + q,k heads 2H + v rows C + qkv bias 3C + proj rows C
  // + proj bias C + ln 2 + fc rows 4C + fc bias 4C + proj rows C + bias C) + ln_f 2.
  const int64_t per_layer = 2 + 2 * H + C + 3 * C + C + C + 2 + 4 * C + 4 * C + C + C;
  EXPECT_EQ(AdamMini::num_blocks(layout, H), gc.padded_vocab + gc.max_seq_len + L * per_layer + 2);

  auto segs = AdamMini::partition(layout, H);
  int64_t v = 0;
  std::map<std::string, int> per_param;
  for (const AdamMiniSegment& s : segs) {
    const ParamInfo& p = layout.params()[s.param_index];
    EXPECT_EQ(s.v_offset, v);
    EXPECT_EQ(s.numel % s.block_len, 0) << p.name;
    EXPECT_GE(s.offset, p.offset);
    EXPECT_LE(s.offset + s.numel, p.offset + p.numel);
    v += s.numel / s.block_len;
    ++per_param[p.name];
  }
  const AdamMiniSegment* qkv = nullptr;
  for (const auto& s : segs)
    if (layout.params()[s.param_index].name == "h.0.attn.c_attn.weight" && !qkv) qkv = &s;
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(per_param["h.0.attn.c_attn.weight"], 3);  // query, key, value
  EXPECT_EQ(qkv[0].block_len, C / H * C);             // a query head: hs rows of C
  EXPECT_EQ(qkv[1].block_len, C / H * C);             // a key head
  EXPECT_EQ(qkv[2].block_len, C);                     // a value row
  EXPECT_EQ(per_param["wte.weight"], 1);
}

TEST(AdamMini, LlamaPartitionFollowsQueryAndKeyValueHeads) {
  ModelConfig lc = ModelConfig::preset("llama-tiny");  // C 96, 4 heads of 24 over 2, F 256
  ParamLayout layout(lc);
  const int64_t C = lc.d_model, H = lc.n_head, KV = lc.n_kv_head, F = lc.ffn_dim,
                hs = lc.head_size(), L = lc.n_layer;
  // embed rows + per layer (norm 1 + q heads H + k heads KV + v rows KV hs + o rows C + norm 1
  // + gate rows F + up rows F + down rows C) + norm 1 + the untied head's rows.
  const int64_t per_layer = 1 + H + KV + KV * hs + C + 1 + F + F + C;
  EXPECT_EQ(AdamMini::num_blocks(layout, H), lc.padded_vocab + L * per_layer + 1 + lc.padded_vocab);
  for (const AdamMiniSegment& s : AdamMini::partition(layout, H)) {
    const ParamInfo& p = layout.params()[s.param_index];
    if (p.role == ParamRole::attn_q_weight || p.role == ParamRole::attn_k_weight) {
      EXPECT_EQ(s.block_len, hs * C) << p.name;
    }
  }
}

TEST(AdamMini, HeadCountMustDivideTheWidth) {
  testing::Slabs s(ModelConfig::preset("gpt2-tiny"));
  OptimConfig c;
  c.n_head = 7;
  try {
    AdamMini opt(c, s.layout, s.pool);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.op(), "adam-mini");
    EXPECT_NE(std::string(e.what()).find("n_head 7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(AdamMini::state_bytes_for(s.layout, 7), ConfigError);
  EXPECT_EQ(s.pool.bytes_current(Category::optimizer), 0u);
}

class AdamMiniFamilies : public ::testing::TestWithParam<Family> {};

TEST_P(AdamMiniFamilies, StepsMatchDoubleReference) {
  ModelConfig config = testing::odd_config();  // GPT-2: width 100, 4 heads of 25
  if (GetParam() == Family::llama) {
    config.family = Family::llama;  // GQA: 4 query heads of 26 over 2 key/value heads
    config.d_model = 104;
    config.n_kv_head = 2;
    config.ffn_dim = 150;
    config.tie_embeddings = false;
    config.finalize();
  }
  testing::Slabs s(config);
  OptimConfig c;
  c.n_head = s.config.n_head;
  c.weight_decay = 0.1f;
  AdamMini opt(c, s.layout, s.pool);
  const float lr = 1e-2f, scale = 0.5f;
  std::vector<double> p = s.params_copy(), m(s.layout.total(), 0.0);
  std::vector<std::vector<double>> v(s.layout.params().size());  // per parameter, per block
  for (int64_t t = 1; t <= 3; ++t) {
    s.fill_grads(400 + static_cast<uint32_t>(t));
    for (size_t i = 0; i < s.layout.params().size(); ++i) {
      const ParamInfo& pi = s.layout.params()[i];
      // Gather each block's elements (not necessarily contiguous in this formulation).
      std::map<int64_t, std::vector<int64_t>> blocks;
      for (int64_t k = 0; k < pi.numel; ++k) blocks[block_of(pi, k, c.n_head)].push_back(k);
      if (v[i].empty()) v[i].assign(blocks.size(), 0.0);
      ASSERT_EQ(v[i].size(), blocks.size()) << pi.name;
      testing::AdamRef r{lr, c.beta1, c.beta2, c.eps, pi.decay ? c.weight_decay : 0.0};
      size_t b = 0;
      for (auto& [id, ks] : blocks) {
        std::vector<double> pb, gb, mb;
        for (int64_t k : ks) {
          pb.push_back(p[pi.offset + k]);
          gb.push_back(scale * static_cast<double>(s.grads.data<float>()[pi.offset + k]));
          mb.push_back(m[pi.offset + k]);
        }
        testing::adam_mini_block_ref(pb.data(), gb.data(), mb.data(), v[i][b++],
                                     static_cast<int64_t>(ks.size()), r, t);
        for (size_t j = 0; j < ks.size(); ++j) {
          p[pi.offset + ks[j]] = pb[j];
          m[pi.offset + ks[j]] = mb[j];
        }
      }
    }
    opt.step(s.params, s.grads, lr, scale);
  }
  testing::expect_all_close(s.params.data<float>(), p.data(), s.layout.total(), 2e-6, 1e-6,
                            "params");
  testing::expect_all_close(opt.state()[0].second.data<float>(), m.data(), s.layout.total(), 1e-8,
                            1e-5, "m");
  // v in partition order equals the reference's blocks in parameter order, row order within.
  std::vector<double> vflat;
  for (const auto& vi : v) vflat.insert(vflat.end(), vi.begin(), vi.end());
  testing::expect_all_close(opt.state()[1].second.data<float>(), vflat.data(),
                            static_cast<int64_t>(vflat.size()), 1e-12, 1e-5, "v");
}

INSTANTIATE_TEST_SUITE_P(Families, AdamMiniFamilies,
                         ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

TEST(AdamMini, StateIsAboutFourBytesPerParameter) {
  ModelConfig gc = ModelConfig::preset("gpt2-tiny");
  ParamLayout layout(gc);
  const int64_t blocks = AdamMini::num_blocks(layout, gc.n_head);
  EXPECT_EQ(AdamMini::state_bytes_for(layout, gc.n_head),
            static_cast<size_t>(layout.total() * 4 + (blocks + 15) / 16 * 16 * 4));
}

}  // namespace
}  // namespace memfit
