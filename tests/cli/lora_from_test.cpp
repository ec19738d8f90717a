// memfit train --init-from BASE --lora-from ADAPTER (cli/options/lora_from.h): the adapters start from
// PEFT's files bit for bit (a run of no steps saves them back byte for byte), and with a
// stateless optimizer (SGD, a constant rate, the same batch) one step from them is the step a
// --resume of the same save takes, every saved file the same; rank, alpha and targets are the
// adapter_config.json's (memfit plan's too), and an option given that says otherwise exits 2
// naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::Output;
using test::slurp;

class LoraFrom : public test::BinaryTest {
 protected:
  LoraFrom() : BinaryTest(13) {}
  std::string common() const {
    return fmt::format(
        "train --model gpt2-tiny --threads 1 --seq-len 32 --batch 2 --eval-every 0 --data '{}' "
        "--precision fp32 --optim sgd --lr 0.05 --lr-schedule constant --warmup 0 "
        "--repeat-batch",
        (dir / "data").string());
  }
};

TEST_F(LoraFrom, LoadsTheAdaptersBitForBitAndStepsAsAResume) {
  const fs::path ck = dir / "ck", resumed = dir / "resumed", from = dir / "from",
                 again = dir / "again";
  const std::string shape = "--lora-rank 4 --lora-alpha 8 --lora-targets attn,fc";
  Output r = memfit(fmt::format("{} --steps 2 {} --save '{}'", common(), shape, ck.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // No steps: the adapters saved back as loaded (rank, alpha, targets from the files).
  r = memfit(fmt::format("{} --steps 0 --init-from '{}' --lora-from '{}' --save '{}'", common(),
                         ck.string(), ck.string(), again.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string adapters = slurp(ck / "adapter_model.safetensors");
  ASSERT_FALSE(adapters.empty());
  EXPECT_TRUE(slurp(again / "adapter_model.safetensors") == adapters) << "the adapters differ";
  EXPECT_EQ(slurp(again / "adapter_config.json"), slurp(ck / "adapter_config.json"));

  // One step from them (the options given equal the files') against one resumed step.
  r = memfit(fmt::format("{} --steps 3 {} --resume '{}' --save '{}'", common(), shape,
                         ck.string(), resumed.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = memfit(fmt::format("{} --steps 1 --lora-rank 4 --init-from '{}' --lora-from '{}' --save '{}'",
                         common(), ck.string(), ck.string(), from.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string stepped = slurp(from / "adapter_model.safetensors");
  EXPECT_TRUE(stepped == slurp(resumed / "adapter_model.safetensors"))
      << "a step from --lora-from is not the resumed step";
  EXPECT_FALSE(stepped == adapters) << "the step changed nothing";
  EXPECT_TRUE(slurp(from / "model.safetensors") == slurp(ck / "model.safetensors"));
}

TEST_F(LoraFrom, OptionsThatDifferFromTheAdaptersAreRefusedNamingThem) {
  const fs::path ck = dir / "ck";
  Output r = memfit(fmt::format("{} --steps 1 --lora-rank 4 --lora-alpha 8 --lora-targets "
                                "attn,fc --save '{}'",
                                common(), ck.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string from =
      fmt::format("--steps 1 --init-from '{}' --lora-from '{}'", ck.string(), ck.string());
  r = memfit(fmt::format("{} {} --lora-rank 8", common(), from));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.says("--lora-rank 8 differs from its adapter_config.json's r 4")) << r.err;
  r = memfit(fmt::format("{} {} --lora-alpha 16", common(), from));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.says("--lora-alpha 16 differs")) << r.err;
  EXPECT_TRUE(r.says("lora_alpha 8")) << r.err;
  r = memfit(fmt::format("{} {} --lora-targets attn", common(), from));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.says("--lora-targets attn differs")) << r.err;
  // memfit plan takes the adapters' shape the same way: the plan of the options spelled out.
  const std::string plan = fmt::format("plan --model gpt2-tiny --seq-len 32 --batch 2 "
                                       "--precision fp32 --optim sgd --init-from '{}'",
                                       ck.string());
  r = memfit(fmt::format("{} --lora-from '{}'", plan, ck.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string planned = r.out;
  r = memfit(fmt::format("{} --lora-rank 4 --lora-alpha 8 --lora-targets attn,fc", plan));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(planned, r.out);
  r = memfit(fmt::format("{} --lora-rank 4 --lora-alpha 8 --lora-targets attn", plan));
  EXPECT_NE(planned, r.out);
  r = memfit(fmt::format("{} --steps 1 --lora-from '{}'", common(), ck.string()));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.says("needs --init-from BASE")) << r.err;
  r = memfit(fmt::format("{} --steps 1 --init-from '{}' --lora-from '{}'", common(), ck.string(),
                         (dir / "data").string()));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.says("no adapter_config.json")) << r.err;
}

}  // namespace
}  // namespace memfit
