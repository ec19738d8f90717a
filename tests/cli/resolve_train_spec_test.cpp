// Run setup (cli/options/resolve_train_spec.h): a config's strings become the typed RunSpec once, and each bad
// option is refused there, naming it, before anything is planned or built.
#include "memfit/cli/options/resolve_train_spec.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/hf/model_hf_config.h"

namespace memfit {
namespace {

TrainConfig tiny() {
  TrainConfig c;
  c.model = "gpt2-tiny";
  c.seq_len = 32;
  c.batch = 4;
  c.grad_accum = 2;
  c.data_dir = "no-such-dir";  // planning needs no data
  return c;
}

TEST(RunSetup, ResolvesTheOptionsIntoTypes) {
  TrainConfig c = tiny();
  c.mem_limit = "3MiB";
  c.precision = "bf16";
  c.attention = "plain";
  c.ckpt = "every:2";
  c.optim.name = "lion";
  c.threads = 1;
  const RunSpec s = resolve_run(c);
  EXPECT_EQ(s.mem_limit, size_t{3} << 20);
  EXPECT_EQ(s.precision.precision, Precision::bf16);
  EXPECT_TRUE(s.precision.master_weights);
  EXPECT_EQ(s.attention, AttentionKind::plain);
  EXPECT_EQ(s.ckpt, CheckpointPolicy::parse("every:2"));
  EXPECT_FALSE(s.ckpt_auto);
  EXPECT_EQ(s.optim.name, "lion");
  EXPECT_EQ(s.optim.n_head, s.model.n_head);
  EXPECT_EQ(s.threads, 1);
  EXPECT_EQ(s.T, 32);
  EXPECT_EQ(s.batch, 4);
  EXPECT_EQ(s.grad_accum, 2);
  EXPECT_EQ(s.model.n_layer, ModelConfig::preset("gpt2-tiny").n_layer);
  EXPECT_FALSE(s.resumed);
  // --act-compress not given: none, open to a search; given: fixed.
  EXPECT_EQ(s.act_compress, ActCompress::none);
  EXPECT_TRUE(s.act_compress_open);
  EXPECT_FALSE(SearchSpace::of(s).compression) << "only --ckpt auto searches";
  c.act_compress = "fp8";
  EXPECT_EQ(resolve_run(c).act_compress, ActCompress::fp8);
  EXPECT_FALSE(resolve_run(c).act_compress_open);
  EXPECT_EQ(resolve_run(c).activation_options().act_compress, ActCompress::fp8);
  c.act_compress.clear();

  c.ckpt = "auto";
  c.auto_batch = true;
  const RunSpec a = resolve_run(c);
  EXPECT_TRUE(a.ckpt_auto);
  EXPECT_TRUE(a.auto_batch);
  EXPECT_EQ(a.ckpt, CheckpointPolicy{});  // the search sets it
  EXPECT_TRUE(SearchSpace::of(a).compression);
  c.act_compress = "none";
  EXPECT_FALSE(SearchSpace::of(resolve_run(c)).compression) << "--act-compress none was given";
}

// `check` refuses c with a ConfigError whose message names `option`.
template <class Check>
void expect_refused(Check check, const TrainConfig& c, const std::string& option) {
  try {
    check(c);
    ADD_FAILURE() << "accepted; expected an error naming " << option;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
  }
}

// Each bad option is a ConfigError whose message names it.
// A resumed checkpoint's config.json and trainer_state.json are read once, however many steps
// of the resolution ask (--precision auto, --act-compress, the model): with both files gone, the
// same StartingCheckpoint resolves the run again, and the trainer gets the state's text.
TEST(RunSetup, TheStartingCheckpointIsReadOnce) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("memfit_run_setup_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  io::write_file_atomic(dir / "config.json",
                        io::model_config_to_hf_json(ModelConfig::preset("gpt2-tiny")).dump());
  const std::string state =
      nlohmann::json{{"step", 3}, {"precision", "bf16"}, {"act_compress", "int8"}}.dump();
  io::write_file_atomic(dir / "trainer_state.json", state);
  TrainConfig c = tiny();
  c.model.clear();
  c.resume_dir = dir.string();
  c.precision = "auto";
  StartingCheckpoint start(c);
  const AutoResolution first = resolve_auto(c, start);
  fs::remove_all(dir);
  const AutoResolution again = resolve_auto(c, start);
  for (const AutoResolution* r : {&first, &again}) {
    EXPECT_EQ(r->spec().precision.precision, Precision::bf16);  // the checkpoint's
    EXPECT_EQ(r->spec().act_compress, ActCompress::int8);
    EXPECT_EQ(r->spec().model.n_layer, ModelConfig::preset("gpt2-tiny").n_layer);
    EXPECT_TRUE(r->train.checkpoint.resume);
    EXPECT_EQ(r->train.checkpoint.option, "--resume");
    ASSERT_TRUE(r->train.checkpoint.state_text.has_value());
    EXPECT_EQ(*r->train.checkpoint.state_text, state);
  }
  // A fresh resolution reads the files, which are gone.
  EXPECT_THROW(resolve_auto(c), Error);
}

TEST(RunSetup, EachBadOptionIsRefusedByName) {
  auto refused = [](auto change, const std::string& option) {
    TrainConfig c = tiny();
    change(c);
    expect_refused([](const TrainConfig& x) { resolve_run(x); }, c, option);
  };
  refused([](TrainConfig& c) { c.mem_limit = "lots"; }, "--mem-limit");
  refused([](TrainConfig& c) { c.batch = 0; }, "--batch");
  refused([](TrainConfig& c) { c.ckpt = "auto"; }, "--mem-limit");  // the search needs a budget
  refused([](TrainConfig& c) { c.master_weights = "maybe"; }, "--master-weights");
  // Pure bf16 is AdamW's stochastic rounding: a rule between options (RunSpec::check).
  refused([](TrainConfig& c) { c.precision = "bf16", c.master_weights = "none", c.optim.name = "lion"; },
          "--master-weights none");
  refused([](TrainConfig& c) { c.attention = "sparse"; }, "sparse");
  refused([](TrainConfig& c) { c.grad_dtype = "fp16"; }, "--grad-dtype");
  refused([](TrainConfig& c) { c.ckpt = "every:0"; }, "every:0");
  refused([](TrainConfig& c) { c.precision = "fp4"; }, "fp4");  // fp8 is one (Note [FP8])
  refused([](TrainConfig& c) { c.act_compress = "int4"; }, "--act-compress");
  // bf16 moments are AdamW's; the quantised optimizers' state is already smaller.
  refused([](TrainConfig& c) { c.optim.name = "adamw8bit", c.optim.state_dtype = DType::bf16; },
          "--optim-state-dtype bf16");
  refused([](TrainConfig& c) { c.optim.name = "adamw4bit", c.optim.state_dtype = DType::bf16; },
          "only --optim adamw");
  // adamw4bit updates f32 weights: pure bf16 is refused as for every optimizer but AdamW's two.
  refused([](TrainConfig& c) {
    c.precision = "bf16", c.master_weights = "none", c.optim.name = "adamw4bit";
  }, "--master-weights none");
  EXPECT_THROW(optim_state_dtype_from_name("f16"), ConfigError);
  EXPECT_EQ(optim_state_dtype_from_name("bf16"), DType::bf16);
}

// --max-model varies the shape and the policy: it needs a budget and refuses options that fix
// what it varies (a fixed --ckpt policy it plans for every member, but not a layers: list).
TEST(RunSetup, MaxModelNeedsABudgetAndLeavesTheShapeToTheSearch) {
  TrainConfig c = tiny();
  EXPECT_THROW(check_max_model_config(c), ConfigError);  // no --mem-limit
  c.mem_limit = "64MiB";
  EXPECT_NO_THROW(check_max_model_config(c));
  c.ckpt = "auto";
  EXPECT_NO_THROW(check_max_model_config(c));
  auto refused = [&](auto change, const std::string& option) {
    TrainConfig x = c;
    change(x);
    expect_refused([](const TrainConfig& y) { check_max_model_config(y); }, x, option);
  };
  refused([](TrainConfig& x) { x.n_layer = 4; }, "--n-layer");
  refused([](TrainConfig& x) { x.d_model = 128; }, "--d-model");
  refused([](TrainConfig& x) { x.n_head = 2; }, "--n-head");
  refused([](TrainConfig& x) { x.ckpt = "layers:0,1"; }, "--ckpt");
  // A fixed policy is planned for every member (memfit plan --max-model --ckpt full).
  for (const char* policy : {"full", "selective", "every:2"}) {
    TrainConfig x = c;
    x.ckpt = policy;
    EXPECT_NO_THROW(check_max_model_config(x)) << policy;
  }
  refused([](TrainConfig& x) { x.resume_dir = "somewhere"; }, "--resume");
  refused([](TrainConfig& x) { x.init_from = "somewhere"; }, "--init-from");
  // --tp is planned per rank of the split model (Note [Tensor parallel], "The searches").
  TrainConfig split = c;
  split.tp = 2;
  EXPECT_NO_THROW(check_max_model_config(split));
}

}  // namespace
}  // namespace memfit
