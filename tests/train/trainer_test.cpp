// The training loop end to end on gpt2-tiny: bit-identical resume, a loss that falls on
// learnable data, the JSON-lines log, and the errors that must leave checkpoints untouched.
#include "memfit/train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/io/atomic_file.h"
#include "memfit/memory/pool.h"
#include "memfit/io/data/token_shard.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class Trainer : public test::TrainerFixture {};

// Both families: a run split by a save and a resume equals the whole run bit for bit.
class TrainerFamilies : public test::TrainerFixture,
                        public ::testing::WithParamInterface<const char*> {};

TEST_P(TrainerFamilies, ResumeIsBitIdenticalToAnUninterruptedRun) {
  auto config = [&] { return TrainerFixture::config(GetParam()); };
  TrainConfig whole = config();
  whole.save_dir = (dir / "whole").string();
  TrainSummary a = train(whole);
  ASSERT_EQ(a.losses.size(), 6u);

  TrainConfig first = config();
  first.save_dir = (dir / "split").string();
  first.log_file = (dir / "split.jsonl").string();
  first.stop_after = 3;
  TrainSummary b = train(first);
  ASSERT_EQ(b.losses.size(), 3u);

  TrainConfig second = config();
  second.resume_dir = first.save_dir;
  second.save_dir = first.save_dir;
  second.log_file = first.log_file;
  TrainSummary c = train(second);
  ASSERT_EQ(c.losses.size(), 3u);
  EXPECT_EQ(c.last_step, 6);

  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.losses[3 + i], c.losses[i]) << "step " << i + 4;  // bit-identical, not near
  }
  EXPECT_EQ(a.last_val_loss, c.last_val_loss);
  EXPECT_EQ(io::read_file_to_string(dir / "whole" / "model.safetensors"),
            io::read_file_to_string(dir / "split" / "model.safetensors"));
  EXPECT_EQ(io::read_file_to_string(dir / "whole" / "optimizer.safetensors"),
            io::read_file_to_string(dir / "split" / "optimizer.safetensors"));
  // The resumed run appended to the log: steps 1..6 once each, in order.
  std::vector<int64_t> steps;
  for (const auto& j : read_log(first.log_file))
    if (j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

// The optimizers with less state (4-bit AdamW, AdamW with bf16 moments): a run split by a save
// and a resume equals the whole run bit for bit, and the loss falls.
TEST_F(Trainer, SmallStateOptimizersResumeBitIdentically) {
  for (const char* optim : {"adamw4bit", "adamw:bf16"}) {
    SCOPED_TRACE(optim);
    auto config = [&] {
      TrainConfig c = TrainerFixture::config("gpt2-tiny");
      c.optim.name = optim;
      if (c.optim.name == "adamw:bf16") {
        c.optim.name = "adamw";
        c.optim.state_dtype = DType::bf16;
      }
      return c;
    };
    const fs::path root = dir / (std::string(optim) == "adamw4bit" ? "q4" : "bf16");
    TrainConfig whole = config();
    whole.save_dir = (root / "whole").string();
    TrainSummary a = train(whole);
    ASSERT_EQ(a.losses.size(), 6u);
    EXPECT_LT(a.losses.back(), a.losses.front());
    TrainConfig first = config();
    first.save_dir = (root / "split").string();
    first.stop_after = 3;
    train(first);
    TrainConfig second = config();
    second.resume_dir = first.save_dir;
    second.save_dir = first.save_dir;
    TrainSummary c = train(second);
    ASSERT_EQ(c.losses.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a.losses[3 + i], c.losses[i]) << "step " << i + 4;
    EXPECT_EQ(io::read_file_to_string(root / "whole" / "optimizer.safetensors"),
              io::read_file_to_string(root / "split" / "optimizer.safetensors"));
    // A resume with the other state dtype is refused, naming the option: trainer_state.json is
    // checked before the optimizer file (whose bf16 moments would only say "is BF16").
    if (std::string(optim) == "adamw:bf16") {
      TrainConfig other = config();
      other.resume_dir = first.save_dir;
      other.optim.state_dtype = DType::f32;
      try {
        train(other);
        ADD_FAILURE() << "resumed bf16 moments into f32 ones";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("--optim-state-dtype"), std::string::npos)
            << e.what();
      }
    }
  }
}

TEST_P(TrainerFamilies, LossFallsAndTheLogHasEveryField) {
  TrainConfig c = config(GetParam());
  c.steps = 30;
  c.eval_every = 10;
  c.log_file = (dir / "log.jsonl").string();
  TrainSummary s = train(c);
  EXPECT_LT(s.losses.back(), s.losses.front() - 1.0f);
  EXPECT_GT(s.unigram_entropy, 0);
  EXPECT_LT(s.last_val_loss, s.unigram_entropy);  // it learned more than token frequencies
  int evals = 0;
  for (const auto& j : read_log(c.log_file)) {
    if (j.contains("val_loss")) {
      ++evals;
      continue;
    }
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes", "mem"})
      EXPECT_TRUE(j.contains(key)) << key << " missing from " << j.dump();
    EXPECT_TRUE(j["mem"].contains("params") && j["mem"].contains("activations")) << j.dump();
  }
  EXPECT_EQ(evals, 3);
  EXPECT_EQ(s.peak_by_category[static_cast<size_t>(Category::optimizer)],
            2 * s.peak_by_category[static_cast<size_t>(Category::params)]);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainerFamilies, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) {
                           return std::string(info.param).substr(0, std::string(info.param).find('-'));
                         });

TEST_F(Trainer, RepeatBatchTrainsEveryStepOnTheSameRowsAndResumesThere) {
  // A learning rate of 1e-30 (0 is refused): every update is far below the weights' last bit, so
  // they never change and the same rows give the same loss every step, bit for bit; without
  // --repeat-batch the rows, and so the losses, differ.
  TrainConfig still = config();
  still.schedule.lr = still.schedule.min_lr = 1e-30f;
  still.steps = 3;
  still.grad_accum = 2;
  TrainConfig moving_rows = still;
  still.repeat_batch = true;
  const TrainSummary same = train(still), other = train(moving_rows);
  for (size_t i = 1; i < same.losses.size(); ++i) {
    EXPECT_EQ(same.losses[i], same.losses[0]) << "step " << i + 1;
    EXPECT_NE(other.losses[i], other.losses[0]) << "step " << i + 1;
  }
  EXPECT_EQ(same.losses[0], other.losses[0]);  // the first step reads the same rows either way

  // Learning: the loss on the one batch falls step after step, and a run stopped and resumed
  // keeps repeating the same batch (bit for bit the uninterrupted run).
  TrainConfig fit = config();
  fit.steps = 4;
  fit.repeat_batch = true;
  fit.save_dir = (dir / "whole").string();
  const TrainSummary whole = train(fit);
  for (size_t i = 1; i < whole.losses.size(); ++i)
    EXPECT_LT(whole.losses[i], whole.losses[i - 1]) << "step " << i + 1;
  TrainConfig first = fit;
  first.save_dir = (dir / "split").string();
  first.stop_after = 2;
  train(first);
  TrainConfig second = fit;
  second.resume_dir = second.save_dir = first.save_dir;
  const TrainSummary rest = train(second);
  ASSERT_EQ(rest.losses.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(rest.losses[i], whole.losses[2 + i]) << "step " << i + 3;
}

TEST_F(Trainer, ASaveAboveMaxShardSizeIsShardedAndResumesBitIdentically) {
  TrainConfig whole = config();
  TrainSummary a = train(whole);
  TrainConfig first = config();
  first.save_dir = (dir / "sharded").string();
  first.max_shard_size = "300KB";
  first.stop_after = 3;
  train(first);
  EXPECT_TRUE(fs::exists(dir / "sharded" / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir / "sharded"))
    shards += e.path().filename().string().rfind("model-0000", 0) == 0;
  EXPECT_GE(shards, 3);
  EXPECT_FALSE(fs::exists(dir / "sharded" / "model.safetensors"));
  TrainConfig second = config();
  second.resume_dir = first.save_dir;
  TrainSummary c = train(second);
  ASSERT_EQ(c.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.losses[3 + i], c.losses[i]) << "step " << i + 4;
  TrainConfig bad = config();
  bad.max_shard_size = "lots";
  EXPECT_THROW(train(bad), ConfigError);
}

// A resume reads the checkpoint's config.json and trainer_state.json once, when the run is
// resolved (TrainSpec's RunCheckpoint): train() loads the weights and the state against what was
// read, so files spoilt after the resolution go unread, and the run continues as the whole one.
TEST_F(Trainer, AResumeReadsTheCheckpointsConfigOnlyWhenResolved) {
  TrainConfig whole = config();
  const TrainSummary a = train(whole);
  TrainConfig first = config();
  first.save_dir = (dir / "split").string();
  first.stop_after = 3;
  train(first);
  TrainConfig second = config();
  second.resume_dir = first.save_dir;
  const AutoResolution resolved = resolve_auto(second);
  EXPECT_EQ(resolved.train.checkpoint.config.n_layer, resolved.spec().model.n_layer);
  for (const char* file : {"config.json", "trainer_state.json"})
    io::write_file_atomic(dir / "split" / file, "not json");
  dist::ProcessGrid grid(dist::make_single_communicator(), dist::GridShape{});
  const TrainSummary c = train(resolved.train, grid);
  ASSERT_EQ(c.losses.size(), 3u);
  EXPECT_EQ(c.last_step, 6);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.losses[3 + i], c.losses[i]) << "step " << i + 4;
  // Resolved afresh, the spoilt config.json is an error: the file above was the one loaded.
  EXPECT_THROW(resolve_auto(second), IoError);
}

TEST_F(Trainer, ZeroStepsSavesTheInitialWeightsWithoutData) {
  TrainConfig c = config();
  c.steps = 0;
  c.data_dir = (dir / "nothing-here").string();
  c.save_dir = (dir / "init").string();
  train(c);
  EXPECT_TRUE(fs::exists(dir / "init" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "init" / "config.json"));
  // Initialising from it starts a fresh run with those weights.
  TrainConfig from = config();
  from.steps = 1;
  from.init_from = c.save_dir;
  EXPECT_EQ(train(from).steps_run, 1);
}

TEST_F(Trainer, OutOfMemoryLeavesTheLastCheckpointIntact) {
  TrainConfig c = config();
  c.steps = 2;
  c.save_dir = (dir / "ckpt").string();
  train(c);
  const std::string before = io::read_file_to_string(dir / "ckpt" / "model.safetensors");
  TrainConfig tight = config();
  tight.resume_dir = c.save_dir;
  tight.save_dir = c.save_dir;
  tight.mem_limit = "1MiB";
  EXPECT_THROW(train(tight), OutOfMemoryError);
  EXPECT_EQ(io::read_file_to_string(dir / "ckpt" / "model.safetensors"), before);
}

TEST_F(Trainer, BadSettingsAreConfigErrorsNamingTheField) {
  auto expect_config_error = [](TrainConfig c, const char* field) {
    try {
      train(c);
      ADD_FAILURE() << "expected ConfigError for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  TrainConfig c = config();
  c.batch = 0;
  expect_config_error(c, "batch");
  c = config();
  c.seq_len = 65;  // gpt2-tiny's context is 64, but from scratch --seq-len sets the context
  c.model = "gpt2-tiny";
  c.mem_limit = "lots";
  expect_config_error(c, "--mem-limit");
  c = config();
  c.schedule.kind = "linear";
  expect_config_error(c, "lr-schedule");
  // Resuming with another batch size would not continue the same run.
  TrainConfig saved = config();
  saved.steps = 1;
  saved.save_dir = (dir / "r").string();
  train(saved);
  TrainConfig other = saved;
  other.steps = 2;
  other.resume_dir = saved.save_dir;
  other.batch = 2;
  expect_config_error(other, "batch");
}

TEST_F(Trainer, MissingDataIsAnIoErrorNamingTheDirectory) {
  TrainConfig c = config();
  c.data_dir = (dir / "missing").string();
  try {
    train(c);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// GPT-2 tokens (up to 50256) under gpt2-tiny's 512-token vocabulary: the error names the preset,
// its vocabulary and the --vocab that holds the token, and with that --vocab the run trains.
TEST_F(Trainer, ATokenPastThePresetsVocabularyNamesThePresetAndTheFix) {
  std::vector<uint16_t> tokens(4000, 7);
  tokens[100] = 50256;
  io::write_token_shard(dir / "data" / "train_000000.bin", tokens);
  TrainConfig c = config();
  c.steps = 1;
  try {
    train(c);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string m = e.what();
    for (const char* part : {"50256", "expected < 512", "preset gpt2-tiny", "--vocab 50257"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
  c.vocab = 50257;
  EXPECT_EQ(train(c).last_step, 1);
}

}  // namespace
}  // namespace memfit
