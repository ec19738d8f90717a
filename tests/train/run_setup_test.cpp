// Run setup (train/run_setup.h): a config's strings become the typed RunSpec once, and each bad
// option is refused there, naming it, before anything is planned or built.
#include "memfit/train/run_setup.h"

#include <gtest/gtest.h>

#include <string>

#include "memfit/core/error.h"

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

  c.ckpt = "auto";
  c.auto_batch = true;
  const RunSpec a = resolve_run(c);
  EXPECT_TRUE(a.ckpt_auto);
  EXPECT_TRUE(a.auto_batch);
  EXPECT_EQ(a.ckpt, CheckpointPolicy{});  // the search sets it
}

// Each bad option is a ConfigError whose message names it.
TEST(RunSetup, EachBadOptionIsRefusedByName) {
  auto refused = [](TrainConfig c, const std::string& option) {
    try {
      resolve_run(c);
      ADD_FAILURE() << "accepted; expected an error naming " << option;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  };
  TrainConfig c = tiny();
  c.mem_limit = "lots";
  refused(c, "--mem-limit");
  c = tiny();
  c.batch = 0;
  refused(c, "--batch");
  c = tiny();
  c.ckpt = "auto";  // the planner needs a budget
  refused(c, "--mem-limit");
  c = tiny();
  c.master_weights = "maybe";
  refused(c, "--master-weights");
  c = tiny();
  c.precision = "bf16";
  c.master_weights = "none";
  c.optim.name = "lion";  // pure bf16 is AdamW's stochastic rounding: a rule between options
  refused(c, "--master-weights none");
  c = tiny();
  c.attention = "sparse";
  refused(c, "sparse");
  c = tiny();
  c.ckpt = "every:0";
  refused(c, "every:0");
  c = tiny();
  c.precision = "fp8";
  refused(c, "fp8");
}

// --max-model's own rules: what it varies is left to it, and it needs a budget.
TEST(RunSetup, MaxModelNeedsABudgetAndLeavesTheShapeToTheSearch) {
  TrainConfig c = tiny();
  EXPECT_THROW(check_max_model_config(c), ConfigError);  // no --mem-limit
  c.mem_limit = "64MiB";
  EXPECT_NO_THROW(check_max_model_config(c));
  c.n_layer = 2;
  EXPECT_THROW(check_max_model_config(c), ConfigError);
}

}  // namespace
}  // namespace memfit
