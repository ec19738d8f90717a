// memfit train --lora-rank --base-dtype nf4 (QLoRA; Note [NF4 weights], "QLoRA") and
// --base-dtype int8 (Note [Int8 weights]), each test for both: the planned peak equals the
// measured one category by category at two shapes of each family (the compact working slab and
// the quantized buffer in params, the tiled products' scratch in the workspace arena, the save's
// dequantization staging); a save holds the dequantized base (model.safetensors) and the
// quantized bytes (base_nf4.safetensors, base_int8.safetensors), from which --resume continues
// bit for bit; the load from --init-from quantizes the checkpoint's linears as the kernel does;
// and what is not built is refused naming the option.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/error.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/quant_base_file.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/model/transformer.h"
#include "memfit/plan/memory_plan.h"
#include "lora_trainer_util.h"
#include "trainer_fixture.h"
#include "../io/io_test_util.h"

namespace memfit {
namespace {

using kernels::WeightQuant;

class QloraTrainer : public test::TrainerFixture {};

constexpr std::pair<LoraBase, WeightQuant> kBases[] = {{LoraBase::nf4, WeightQuant::nf4},
                                                       {LoraBase::int8, WeightQuant::int8}};

TEST_F(QloraTrainer, PlannedPeakEqualsMeasuredAtTwoShapesOfEachFamily) {
  for (const auto& [base_, format_] : kBases) {
    const LoraBase base = base_;
    const WeightQuant format = format_;
    for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
      for (const auto& [precision, batch, accum, rank, saves] :
           {std::tuple{"bf16", 4, 1, 4, false}, std::tuple{"fp32", 10, 2, 8, true}}) {
        SCOPED_TRACE(fmt::format("{} {} {} batch {} accum {} rank {} save {}",
                                 kernels::weight_quant_name(format), model, precision, batch, accum,
                                 rank, saves));
        TrainConfig c = config(model);
        c.precision = precision;
        c.batch = batch;
        c.grad_accum = accum;
        c.steps = 2;
        c.eval_every = 0;
        c.lora.rank = rank;
        c.lora.base = base;
        c.lora.targets = std::string(model) == "gpt2-tiny" ? "attn,fc" : "all-linear";
        if (saves)
          c.save_dir =
              (dir / fmt::format("save_{}_{}", model, kernels::weight_quant_name(format))).string();
        const RunSpec spec = resolve_run(c);
        const PlanReport plan = plan_training(spec);
        const TrainSummary s = train(c);
        EXPECT_TRUE(std::isfinite(s.last_loss));
        EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
        for (Category cat : kAllCategories)
          EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                    s.peak_by_category[static_cast<size_t>(cat)])
              << category_name(cat);
        EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::master)], 0u);
        // The quantized buffer in params, the compact slab and the adapters beside it.
        ModelConfig m = spec.model;
        m.finalize();
        int64_t compact = 0;
        (void)ParamLayout(m).compact_offsets(&compact);
        const size_t adapters = plan.by_category[static_cast<size_t>(Category::grads)];
        EXPECT_EQ(plan.quant_base_bytes, MemoryPool::round_up(QuantBaseLayout(m, format).bytes()));
        EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::params)],
                  MemoryPool::round_up(static_cast<size_t>(compact) *
                                       (std::string(precision) == "bf16" ? 2 : 4)) +
                      plan.quant_base_bytes + adapters);
      }
    }
  }
}

// Two steps, a save, then --resume to four: the adapters, their optimizer state, the saved
// base (dequantized) and the quantized bytes are byte for byte those of four steps in one go,
// and those bytes are the ones the first run quantized (the base never changes); a resume with
// a bf16 base or the other format is refused naming the options.
TEST_F(QloraTrainer, ResumeIsBitIdenticalToOneRun) {
  for (const auto& [base_, format_] : kBases) {
    const LoraBase base = base_;  // (lambdas capture variables, not bindings)
    const WeightQuant format = format_;
    for (const char* model : {"llama-tiny", "gpt2-tiny"}) {
      const std::string name(kernels::weight_quant_name(format));
      SCOPED_TRACE(fmt::format("{} {}", name, model));
      const std::filesystem::path d = dir / (name + "_" + model);
      TrainConfig c = config(model);
      c.precision = "bf16";
      c.steps = 4;
      c.eval_every = 0;
      c.lora.rank = 4;
      c.lora.base = base;
      test::expect_lora_resume_matches_one_run(d, c, 2, [&](const std::filesystem::path& split) {
        for (const LoraBase wrong : {LoraBase::bf16, base == LoraBase::nf4 ? LoraBase::int8
                                                                           : LoraBase::nf4}) {
          TrainConfig other = c;
          other.lora.base = wrong;
          other.resume_dir = split.string();
          try {
            train(other);
            ADD_FAILURE() << "a quantized-base checkpoint resumed with " << lora_base_name(wrong);
          } catch (const ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find("--base-dtype"), std::string::npos) << e.what();
          }
        }
        // The save holds this format's file alone.
        EXPECT_TRUE(std::filesystem::exists(split / io::quant_base_file(format)));
        EXPECT_FALSE(std::filesystem::exists(
            split / io::quant_base_file(format == WeightQuant::nf4 ? WeightQuant::int8
                                                                   : WeightQuant::nf4)));
      });
      const std::string file = io::quant_base_file(format);
      EXPECT_EQ(io::testing::first_difference(d / "whole" / file, d / "split" / file), "");
      // The base after four steps is the base a run of no steps quantizes: frozen.
      TrainConfig none = c;
      none.steps = 0;
      none.save_dir = (d / "none").string();
      train(none);
      EXPECT_EQ(io::testing::first_difference(d / "whole" / file, d / "none" / file), "");
    }
  }
}

// --init-from a memfit checkpoint: the quantized base is the format's quantization of each of
// its fused linear matrices, and the save's model.safetensors holds them dequantized (a plain
// model: its q|k|v rows are the quantized values), its other tensors as loaded.
TEST_F(QloraTrainer, InitFromQuantizesTheCheckpointAndTheSaveHoldsItDequantized) {
  TrainConfig base = config("llama-tiny");
  base.steps = 1;
  base.eval_every = 0;
  base.save_dir = (dir / "base").string();
  train(base);
  for (const auto& [lora_base_, format_] : kBases) {
    const LoraBase lora_base = lora_base_;
    const WeightQuant format = format_;
    const std::string name(kernels::weight_quant_name(format));
    SCOPED_TRACE(name);
    TrainConfig c = config();
    c.model.clear();
    c.init_from = base.save_dir;
    c.steps = 1;
    c.eval_every = 0;
    c.lora.rank = 4;
    c.lora.base = lora_base;
    c.save_dir = (dir / ("qlora_" + name)).string();
    train(c);
    const ModelConfig mc = io::read_checkpoint_config(dir / "base");
    MemoryPool pool;
    Transformer f(mc, pool);
    io::load_checkpoint(io::ReadCheckpoint{dir / "base", mc}, mc, f.layout(), f.weights());
    const QuantBaseLayout layout(mc, format);
    Tensor saved = Tensor::empty(pool, {static_cast<int64_t>(layout.bytes())}, DType::u8,
                                 Category::staging, "saved");
    const std::filesystem::path save = dir / ("qlora_" + name);
    io::load_quant_base(save / io::quant_base_file(format), layout, saved);
    const ModelWeights views = f.layout().views(f.params());
    const QuantMatrix& m = layout.matrix(1, LinearSlot::qkv);
    const auto bytes = static_cast<int64_t>(layout.matrix_bytes(m));
    Tensor want = Tensor::empty(pool, {bytes}, DType::u8, Category::staging, "want");
    kernels::QuantWeight ww = kernels::QuantWeight::view(format, want.raw_data(), m.rows, m.cols);
    const auto floats =
        static_cast<int64_t>(kernels::quant_quantize_scratch_bytes(format, m.rows, m.cols) / 4);
    Tensor scratch = Tensor::empty(pool, {std::max<int64_t>(floats, 1)}, DType::f32,
                                   Category::staging, "scratch");
    kernels::quant_quantize(views.blocks[1].qkv_w, ww, scratch);
    EXPECT_EQ(std::memcmp(want.raw_data(), static_cast<const std::byte*>(saved.raw_data()) + m.at,
                          static_cast<size_t>(bytes)),
              0);
    // The save's q_proj of layer 1: the first rows of that matrix, dequantized.
    io::SafetensorsReader r(save / "model.safetensors");
    const auto& e = r.at("model.layers.1.self_attn.q_proj.weight");
    Tensor got = Tensor::empty(pool, {e.shape[0], e.shape[1]}, DType::f32, Category::staging, "q");
    r.read(e, got);
    Tensor deq = Tensor::empty(pool, {e.shape[0], e.shape[1]}, DType::f32, Category::staging, "d");
    kernels::quant_dequantize_rows(
        kernels::QuantWeight::view(format, static_cast<std::byte*>(saved.raw_data()) + m.at,
                                   m.rows, m.cols),
        0, deq);
    EXPECT_EQ(std::memcmp(got.raw_data(), deq.raw_data(), deq.nbytes()), 0);
    const auto& n = r.at("model.norm.weight");
    Tensor norm = Tensor::empty(pool, {n.shape[0]}, DType::f32, Category::staging, "n");
    r.read(n, norm);
    EXPECT_EQ(std::memcmp(norm.raw_data(), f.param("model.norm.weight").raw_data(),
                          norm.nbytes()),
              0);
  }
}

TEST_F(QloraTrainer, RefusesWhatIsNotBuiltNamingTheOption) {
  auto refused = [&](TrainConfig c, const char* needle) {
    try {
      resolve_run(c);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (const auto& [base_, format_] : kBases) {
    const LoraBase base = base_;
    const WeightQuant format = format_;
    const std::string name(kernels::weight_quant_name(format));
    SCOPED_TRACE(name);
    TrainConfig c = config("llama-tiny");
    c.lora.rank = 4;
    c.lora.base = base;
    TrainConfig no_lora = c;
    no_lora.lora.rank = 0;
    refused(no_lora, ("--base-dtype " + name +
                      " stores the frozen base of a LoRA run: it needs --lora-rank").c_str());
    TrainConfig bf16_fp32 = c;
    bf16_fp32.lora.base = LoraBase::bf16;
    refused(bf16_fp32, "--base-dtype bf16 is the base of --precision bf16");
    TrainConfig fp16 = c;
    fp16.precision = "fp16";
    refused(fp16, "--precision fp16");
    TrainConfig zero = c;
    zero.zero = 1;
    refused(zero, "--zero");
    TrainConfig off = c;
    off.offload_optimizer = "nvme";
    off.offload_dir = (dir / "off").string();
    refused(off, "--offload");
    TrainConfig update = c;
    update.update_in_backward = true;
    refused(update, "--update-in-backward");
  }
  EXPECT_EQ(lora_base_from_name("int8"), LoraBase::int8);
  EXPECT_EQ(lora_base_from_name("nf4"), LoraBase::nf4);
  try {
    (void)lora_base_from_name("fp8");
    ADD_FAILURE() << "fp8 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16, nf4 or int8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
