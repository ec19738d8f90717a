// config.json: the field names and values transformers' ModelConfig expects, read back the same,
// and clear errors (file and field) for what memfit cannot load.
#include "memfit/io/hf/gpt2_hf_config.h"

#include <gtest/gtest.h>

#include <string>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

using nlohmann::json;
using testing::ScratchDir;

// openai-community/gpt2's config.json as published (dropouts 0.1, task params and all).
constexpr const char* kPublishedGpt2 = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

void expect_config_error(const json& j, const std::vector<std::string>& needles) {
  try {
    gpt2_config_from_hf_json(j, "some/dir/config.json");
    ADD_FAILURE() << "expected ConfigError for " << j.dump();
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("some/dir/config.json"), std::string::npos) << msg;
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(Gpt2HfConfig, WritesTheFieldsTransformersExpects) {
  ModelConfig c = ModelConfig::preset("gpt2");
  json j = gpt2_config_to_hf_json(c);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_layer"], 12);
  EXPECT_EQ(j["n_head"], 12);
  EXPECT_EQ(j["n_embd"], 768);
  EXPECT_EQ(j["n_positions"], 1024);
  EXPECT_EQ(j["n_ctx"], 1024);
  EXPECT_EQ(j["vocab_size"], 50257);  // the real vocabulary, not the padded one
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["resid_pdrop"], 0.0);
  EXPECT_EQ(j["embd_pdrop"], 0.0);
  EXPECT_EQ(j["attn_pdrop"], 0.0);
  EXPECT_EQ(j["initializer_range"], 0.02);
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_TRUE(j["n_inner"].is_null());
  EXPECT_EQ(j["scale_attn_weights"], true);

  ModelConfig tiny = ModelConfig::preset("gpt2-tiny");
  json t = gpt2_config_to_hf_json(tiny, DType::bf16);
  EXPECT_TRUE(t["bos_token_id"].is_null());  // no <|endoftext|> in a 512-token vocabulary
  EXPECT_TRUE(t["eos_token_id"].is_null());
  EXPECT_EQ(t["torch_dtype"], "bfloat16");
}

TEST(Gpt2HfConfig, RoundTripsThroughAFile) {
  ScratchDir dir;
  ModelConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.d_model = 16;
  c.max_seq_len = 24;
  c.vocab_size = 100;
  c.finalize();
  write_file_atomic(dir / "config.json", gpt2_config_to_hf_json(c).dump(2));
  ModelConfig back = read_gpt2_config(dir / "config.json");
  EXPECT_EQ(back.n_layer, 3);
  EXPECT_EQ(back.n_head, 2);
  EXPECT_EQ(back.d_model, 16);
  EXPECT_EQ(back.max_seq_len, 24);
  EXPECT_EQ(back.vocab_size, 100);
  EXPECT_EQ(back.padded_vocab, 128);
}

TEST(Gpt2HfConfig, ReadsThePublishedGpt2Config) {
  ModelConfig c = gpt2_config_from_hf_json(json::parse(kPublishedGpt2), "gpt2/config.json");
  ModelConfig want = ModelConfig::preset("gpt2");
  EXPECT_EQ(c.n_layer, want.n_layer);
  EXPECT_EQ(c.n_head, want.n_head);
  EXPECT_EQ(c.d_model, want.d_model);
  EXPECT_EQ(c.max_seq_len, want.max_seq_len);
  EXPECT_EQ(c.vocab_size, want.vocab_size);
  EXPECT_EQ(c.padded_vocab, want.padded_vocab);
}

TEST(Gpt2HfConfig, NamesTheFileAndFieldAtFault) {
  json good = json::parse(kPublishedGpt2);
  json j = good;
  j.erase("n_embd");
  expect_config_error(j, {"missing field 'n_embd'"});
  j = good;
  j["n_head"] = "12";
  expect_config_error(j, {"'n_head'", "positive integer", "\"12\""});
  j = good;
  j["n_layer"] = 0;
  expect_config_error(j, {"'n_layer'", "positive integer"});
  j = good;
  j["activation_function"] = "relu";
  expect_config_error(j, {"'activation_function'", "relu", "gelu_new"});
  j = good;
  j["layer_norm_epsilon"] = 1e-6;
  expect_config_error(j, {"'layer_norm_epsilon'"});
  j = good;
  j["n_inner"] = 1000;
  expect_config_error(j, {"'n_inner'", "3072"});
  j = good;
  j["tie_word_embeddings"] = false;
  expect_config_error(j, {"'tie_word_embeddings'"});
  j = good;
  j["model_type"] = "llama";
  expect_config_error(j, {"'model_type'", "llama"});
  j = good;
  j["n_head"] = 7;
  expect_config_error(j, {"not a multiple of n_head 7"});
  expect_config_error(json::array(), {"JSON object"});
  j = good;
  j["n_inner"] = 3072;  // explicit 4 n_embd is fine
  j["activation_function"] = "gelu_pytorch_tanh";
  EXPECT_NO_THROW(gpt2_config_from_hf_json(j, "x"));
}

TEST(Gpt2HfConfig, UnreadableOrInvalidJsonIsAnIoError) {
  ScratchDir dir;
  write_file_atomic(dir / "config.json", std::string_view("{\"n_layer\": 12,"));
  try {
    read_gpt2_config(dir / "config.json");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "config.json").string()), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_gpt2_config(dir / "missing.json"), IoError);
}

}  // namespace
}  // namespace memfit::io
