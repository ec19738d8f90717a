// The trainer end to end in bf16, fp16 and pure bf16 on gpt2-tiny: the loss falls and the log
// says what fp16 did; a loss scale that overflows is backed off over skipped steps; a
// non-finite loss stops the run naming the step and the tensor without touching the last
// checkpoint; checkpoints cross precisions (F32 master weights, BF16 pure-bf16 weights); and a
// resume is bit-identical in the same precision and refused in another.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/cpu.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/model/transformer.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class MixedPrecisionTrainer : public test::TrainerFixture {
 protected:
  // config() in `precision`; fp16 takes plain attention (flash is fp32/bf16 only).
  TrainConfig in(const std::string& precision, bool master_weights = true) const {
    TrainConfig c = config();
    c.precision = precision;
    c.master_weights = master_weights ? "fp32" : "none";
    if (precision == "fp16") c.attention = "plain";
    return c;
  }
  // Every entry of a directory tree by relative path, with the bytes of the files.
  static std::map<std::string, std::string> tree(const fs::path& root) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root))
      out[fs::relative(e.path(), root).string()] =
          e.is_regular_file() ? io::read_file_to_string(e.path()) : "<dir>";
    return out;
  }
  // The stored dtype of every tensor of a model.safetensors.
  static std::vector<io::SafetensorsDType> dtypes(const fs::path& checkpoint) {
    io::SafetensorsReader r(checkpoint / io::kModelFile);
    std::vector<io::SafetensorsDType> out;
    for (const auto& e : r.entries()) out.push_back(e.dtype);
    return out;
  }
};

TEST_F(MixedPrecisionTrainer, TheLossFallsInEveryPrecisionAndFp16LogsItsScale) {
  struct Run {
    const char* name;
    TrainConfig config;
  };
  const Run runs[] = {{"bf16", in("bf16")}, {"fp16", in("fp16")}, {"pure bf16", in("bf16", false)}};
  for (Run run : runs) {
    SCOPED_TRACE(run.name);
    TrainConfig& c = run.config;
    c.steps = 30;
    c.eval_every = 10;
    c.log_file = (dir / fmt::format("{}.jsonl", run.name)).string();
    TrainSummary s = train(c);
    ASSERT_EQ(s.losses.size(), 30u);
    EXPECT_LT(s.losses.back(), s.losses.front() - 1.0f);
    EXPECT_LT(s.last_val_loss, s.unigram_entropy);
    const bool fp16 = c.precision == "fp16";
    int64_t skipped = 0;
    for (const auto& j : read_log(c.log_file)) {
      if (j.contains("val_loss")) continue;
      EXPECT_EQ(j.contains("loss_scale"), fp16) << j.dump();
      EXPECT_EQ(j.contains("skipped"), fp16) << j.dump();
      if (!fp16) continue;
      EXPECT_TRUE(j["loss_scale"].is_number()) << j.dump();
      skipped += j["skipped"].get<bool>();
    }
    EXPECT_EQ(skipped, s.skipped_steps);
    if (!fp16) {
      EXPECT_EQ(s.skipped_steps, 0);
    }
  }
}

TEST_F(MixedPrecisionTrainer, AnOverflowingLossScaleIsHalvedOverSkippedStepsThenTrains) {
  TrainConfig c = in("fp16");
  c.steps = 20;
  c.loss_scaler.initial_scale = 0x1p30f;  // dloss 2^30 / 128 per position: far past f16
  c.loss_scaler.max_scale = 0x1p30f;
  c.loss_scaler.hysteresis = 1;
  c.log_file = (dir / "log.jsonl").string();
  TrainSummary s = train(c);
  ASSERT_EQ(s.losses.size(), 20u);
  EXPECT_GT(s.skipped_steps, 0);
  EXPECT_TRUE(std::isfinite(s.last_loss));

  std::vector<nlohmann::json> steps;
  for (const auto& j : read_log(c.log_file))
    if (j.contains("loss")) steps.push_back(j);
  ASSERT_EQ(steps.size(), 20u);
  // The skipped steps come first, the scale halving after each; from the first clean step on
  // the scale holds (the window is 1000) and no step is skipped.
  int64_t k = 0;
  while (k < 20 && steps[k]["skipped"].get<bool>()) {
    EXPECT_EQ(steps[k]["loss_scale"].get<double>(), std::ldexp(1.0, 30 - int(k))) << k;
    EXPECT_TRUE(steps[k]["grad_norm"].is_null());
    ++k;
  }
  EXPECT_EQ(k, s.skipped_steps);
  ASSERT_LT(k, 15) << "too few clean steps left to see training continue";
  for (int64_t i = k; i < 20; ++i) {
    EXPECT_FALSE(steps[i]["skipped"].get<bool>()) << "step " << i + 1;
    EXPECT_EQ(steps[i]["loss_scale"].get<double>(), std::ldexp(1.0, 30 - int(k)));
    EXPECT_TRUE(steps[i]["grad_norm"].is_number());
  }
  // A skipped step does not advance the learning-rate schedule (loss_scaler.h): the first step
  // that updates runs at the first warmup rate.
  LrSchedule sched = c.schedule;
  sched.total = c.steps;
  EXPECT_EQ(steps[k]["lr"].get<float>(), sched.at(0));
  EXPECT_LT(s.losses.back(), s.losses[k] - 0.5f);
}

TEST_F(MixedPrecisionTrainer, ANonFiniteLossStopsNamingTheStepAndTensorAndSavesNothing) {
  TrainConfig good = config();
  good.steps = 2;
  good.save_dir = (dir / "good").string();
  train(good);

  // A copy of the checkpoint with one weight poisoned.
  const fs::path poisoned = dir / "poisoned";
  {
    MemoryPool pool;
    const ModelConfig mc = io::read_model_config(dir / "good" / io::kConfigFile);
    Transformer gpt(mc, pool);
    io::load_checkpoint(good.save_dir, mc, gpt.layout(), gpt.weights());
    gpt.param("h.1.mlp.c_fc.weight").data<float>()[3] = std::numeric_limits<float>::infinity();
    gpt.param("h.0.attn.c_proj.weight").data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    io::save_checkpoint(poisoned, mc, gpt.layout(), gpt.weights());
  }
  const auto before = tree(dir);

  // fp16 skips overflowing steps, but not at the scale's floor: a non-finite weight stops it
  // too, after the scale has backed off to the floor (here: from the floor itself).
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = in(precision);
    c.init_from = poisoned.string();
    c.save_dir = good.save_dir;
    c.save_every = 1;
    c.loss_scaler.initial_scale = c.loss_scaler.min_scale = 4.0f;
    try {
      train(c);
      ADD_FAILURE() << "expected memfit::Error";
    } catch (const ConfigError& e) {
      ADD_FAILURE() << "a ConfigError: " << e.what();
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("step 1:"), std::string::npos) << what;
      // The weights are scanned in layout order: h.0's NaN comes before h.1's inf.
      const std::string culprit = std::string("h.0.attn.c_proj.weight (") +
                                  (c.precision == "fp32" ? "weight)" : "master weight)");
      if (c.precision == "fp16") {
        EXPECT_NE(what.find("step 1:"), std::string::npos) << "stopped late: " << what;
      }
      EXPECT_NE(what.find(culprit), std::string::npos) << what;
    }
    EXPECT_TRUE(tree(dir) == before) << "the run left files behind or changed the checkpoint";
  }
}

TEST_F(MixedPrecisionTrainer, CheckpointsLoadAcrossPrecisions) {
  // An fp32 run to start from, trained so that its loss is far from the initial one.
  TrainConfig base = config();
  base.steps = 12;
  base.save_dir = (dir / "fp32").string();
  train(base);
  auto model_bytes = [&](const char* name) {
    return io::read_file_to_string(dir / name / io::kModelFile);
  };

  // fp32 -> bf16: the master weights are fp32's exactly (saved back as F32, byte for byte),
  // and the first step's loss is fp32's within bf16's rounding.
  TrainConfig to_bf16 = in("bf16");
  to_bf16.init_from = base.save_dir;
  to_bf16.steps = 0;
  to_bf16.save_dir = (dir / "bf16_from_fp32").string();
  train(to_bf16);
  EXPECT_EQ(model_bytes("bf16_from_fp32"), model_bytes("fp32"));
  for (auto t : dtypes(dir / "bf16_from_fp32")) EXPECT_EQ(t, io::SafetensorsDType::F32);
  TrainConfig step32 = config(), step16 = in("bf16");
  step32.init_from = step16.init_from = base.save_dir;
  step32.steps = step16.steps = 1;
  const float loss32 = train(step32).losses.at(0), loss16 = train(step16).losses.at(0);
  EXPECT_LT(loss32, std::log(512.0f) - 1.0f) << "the checkpoint was not loaded";
  EXPECT_NEAR(loss16, loss32, 5e-3 * loss32);

  // bf16 with master weights saves F32 master weights; fp32 loads them exactly.
  TrainConfig b16 = in("bf16");
  b16.init_from = base.save_dir;
  b16.steps = 3;
  b16.save_dir = (dir / "bf16").string();
  train(b16);
  for (auto t : dtypes(dir / "bf16")) EXPECT_EQ(t, io::SafetensorsDType::F32);
  EXPECT_NE(model_bytes("bf16"), model_bytes("fp32")) << "bf16 training changed nothing";
  TrainConfig from_b16 = config();
  from_b16.init_from = b16.save_dir;
  from_b16.steps = 0;
  from_b16.save_dir = (dir / "fp32_from_bf16").string();
  train(from_b16);
  EXPECT_EQ(model_bytes("fp32_from_bf16"), model_bytes("bf16"));

  // Pure bf16 saves its BF16 weights as BF16; fp32 loads them widened, exactly.
  TrainConfig pure = in("bf16", false);
  pure.init_from = base.save_dir;
  pure.steps = 3;
  pure.save_dir = (dir / "pure").string();
  train(pure);
  for (auto t : dtypes(dir / "pure")) EXPECT_EQ(t, io::SafetensorsDType::BF16);
  TrainConfig from_pure = config();
  from_pure.init_from = pure.save_dir;
  from_pure.steps = 0;
  from_pure.save_dir = (dir / "fp32_from_pure").string();
  train(from_pure);
  io::SafetensorsReader bf(dir / "pure" / io::kModelFile);
  io::SafetensorsReader f32(dir / "fp32_from_pure" / io::kModelFile);
  ASSERT_EQ(bf.entries().size(), f32.entries().size());
  for (const io::SafetensorsEntry& e : bf.entries()) {
    SCOPED_TRACE(e.name);
    const io::SafetensorsEntry& w = f32.at(e.name);
    ASSERT_EQ(w.dtype, io::SafetensorsDType::F32);
    ASSERT_EQ(w.shape, e.shape);
    const std::byte* h = bf.bytes(e);
    const std::byte* f = f32.bytes(w);
    int64_t bad = 0;
    for (int64_t i = 0; i < e.numel(); ++i) {
      uint16_t bits;
      float got;
      std::memcpy(&bits, h + 2 * i, 2);
      std::memcpy(&got, f + 4 * i, 4);
      const float want = f32_from_bf16(bits);
      bad += std::memcmp(&got, &want, 4) != 0;
    }
    EXPECT_EQ(bad, 0);
  }
}

class MixedPrecisionResume : public MixedPrecisionTrainer,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(MixedPrecisionResume, IsBitIdenticalToAnUninterruptedRun) {
  const std::string mode = GetParam();
  auto make = [&] {
    TrainConfig c = mode == "pure bf16" ? in("bf16", false) : in(mode);
    // fp16: a scale that overflows at first, so that the first session skips steps and cuts
    // the scale, and the second must take over the scaler's state to continue identically.
    c.loss_scaler.initial_scale = 0x1p22f;
    return c;
  };
  TrainConfig whole = make();
  whole.save_dir = (dir / "whole").string();
  TrainSummary a = train(whole);
  ASSERT_EQ(a.losses.size(), 6u);

  TrainConfig first = make();
  first.save_dir = (dir / "split").string();
  first.stop_after = 3;
  TrainSummary b = train(first);
  ASSERT_EQ(b.losses.size(), 3u);

  TrainConfig second = make();
  second.resume_dir = second.save_dir = first.save_dir;
  TrainSummary c = train(second);
  ASSERT_EQ(c.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.losses[3 + i], c.losses[i]) << "step " << i + 4;  // bit-identical, not near
  }
  EXPECT_EQ(a.last_val_loss, c.last_val_loss);
  for (std::string_view file : {io::kModelFile, io::kOptimizerFile})
    EXPECT_EQ(io::read_file_to_string(dir / "whole" / file),
              io::read_file_to_string(dir / "split" / file))
        << file;
  EXPECT_EQ(a.skipped_steps, b.skipped_steps + c.skipped_steps);
  if (mode == "fp16") {
    EXPECT_GT(b.skipped_steps, 0) << "the first session should have skipped steps";
    EXPECT_LT(a.skipped_steps, 6) << "no step updated";
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, MixedPrecisionResume,
                         ::testing::Values("bf16", "fp16", "pure bf16"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == ' ') ch = '_';
                           return s;
                         });

TEST_F(MixedPrecisionTrainer, ResumingInAnotherPrecisionIsAConfigError) {
  // Plain attention, so that fp16 differs from the saved run in the precision alone.
  TrainConfig saved = in("bf16");
  saved.attention = "plain";
  saved.steps = 2;
  saved.stop_after = 1;
  saved.save_dir = (dir / "ckpt").string();
  train(saved);
  const auto before = tree(dir / "ckpt");
  auto expect_refused = [&](TrainConfig c, const char* field) {
    c.attention = "plain";
    c.steps = 2;
    c.resume_dir = c.save_dir = saved.save_dir;
    try {
      train(c);
      ADD_FAILURE() << "expected ConfigError for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_refused(in("fp32"), "precision");
  expect_refused(in("fp16"), "precision");
  expect_refused(in("bf16", false), "master_weights");
  EXPECT_TRUE(tree(dir / "ckpt") == before);
  // The same settings resume.
  TrainConfig same = saved;
  same.stop_after = 0;
  same.resume_dir = saved.save_dir;
  EXPECT_EQ(train(same).last_step, 2);
}

// --precision auto resolves by the CPU (bf16 with native bf16 matmuls, else fp32), is recorded
// resolved in trainer_state.json, and a resume with auto keeps the checkpoint's precision even
// where the CPU would pick the other (MEMFIT_MAX_ISA=avx2 in CI's second run picks fp32).
TEST_F(MixedPrecisionTrainer, PrecisionAutoPicksByTheCpuRecordsItAndResumesInIt) {
  std::string why;
  const Precision picked = auto_precision(&why);
  EXPECT_EQ(picked, cpu::has(cpu::Isa::avx512_bf16) ? Precision::bf16 : Precision::fp32);
  EXPECT_NE(why.find(cpu::isa_name(cpu::max_isa())), std::string::npos) << why;

  TrainConfig c = in("auto");
  c.steps = 2;
  c.stop_after = 1;
  c.save_dir = (dir / "ckpt").string();
  train(c);
  const auto state = nlohmann::json::parse(io::read_file_to_string(dir / "ckpt" / "trainer_state.json"));
  EXPECT_EQ(state["precision"], precision_name(picked));

  // A checkpoint in the precision auto would not pick here: auto resumes in it.
  const std::string other = picked == Precision::bf16 ? "fp32" : "bf16";
  TrainConfig saved = in(other);
  saved.steps = 2;
  saved.stop_after = 1;
  saved.save_dir = (dir / "other").string();
  train(saved);
  TrainConfig resume = in("auto");
  resume.steps = 2;
  resume.resume_dir = resume.save_dir = saved.save_dir;
  TrainConfig resolved = resume;
  const std::string note = resolve_precision(resolved);
  EXPECT_EQ(resolved.precision, other);
  EXPECT_NE(note.find("checkpoint"), std::string::npos) << note;
  EXPECT_EQ(train(resume).last_step, 2);
  const auto after = nlohmann::json::parse(io::read_file_to_string(dir / "other" / "trainer_state.json"));
  EXPECT_EQ(after["precision"], other);
}

}  // namespace
}  // namespace memfit
