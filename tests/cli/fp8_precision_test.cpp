// `memfit train|plan --precision fp8` (Note [FP8]): the run says on stderr that its numerics are
// FP8's and its speed bf16's, records fp8 in the checkpoint, and a combination that is not
// built (LoRA, no master weights, sampling) exits 2 naming the option.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

class Fp8Precision : public test::BinaryTest {
 protected:
  Fp8Precision() : BinaryTest(17) {}
  std::string tiny() const {
    return fmt::format("--model gpt2-tiny --seq-len 32 --batch 2 --threads 1 --eval-batches 1 "
                       "--data '{}'",
                       (dir / "data").string());
  }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

constexpr const char* kSaid = "the numerics are FP8's and the speed is bf16's";

TEST_F(Fp8Precision, TrainAndPlanSayWhatFp8IsAndTheCheckpointRecordsIt) {
  const auto ck = dir / "ck";
  ASSERT_EQ(run_memfit(fmt::format("train {} --precision fp8 --steps 2 --save '{}'", tiny(),
                                   ck.string())),
            0)
      << err();
  EXPECT_NE(err().find(kSaid), std::string::npos) << err();
  const nlohmann::json state = nlohmann::json::parse(test::slurp(ck / "trainer_state.json"));
  EXPECT_EQ(state["precision"], "fp8");
  ASSERT_EQ(run_memfit(fmt::format("plan {} --precision fp8", tiny())), 0) << err();
  EXPECT_NE(err().find(kSaid), std::string::npos) << err();
  // Sampling has no FP8 path: refused naming it; the checkpoint samples in bf16.
  const std::string sample = fmt::format(
      "sample --checkpoint '{}' --prompt 'a' --tokens 2 --tokenizer byte --precision ", ck.string());
  EXPECT_EQ(run_memfit(sample + "fp8"), 2);
  EXPECT_NE(err().find("--precision fp8 is not built for sampling"), std::string::npos) << err();
  EXPECT_EQ(run_memfit(sample + "bf16"), 0) << err();
}

TEST_F(Fp8Precision, WhatIsNotBuiltExits2NamingTheOption) {
  EXPECT_EQ(run_memfit(fmt::format("train {} --precision fp8 --steps 1 --lora-rank 4", tiny())),
            2);
  EXPECT_NE(err().find("--lora-rank with --precision fp8 is not built"), std::string::npos)
      << err();
  EXPECT_EQ(
      run_memfit(fmt::format("train {} --precision fp8 --steps 1 --master-weights none", tiny())),
      2);
  EXPECT_NE(err().find("--master-weights none with --precision fp8"), std::string::npos) << err();
}

}  // namespace
}  // namespace memfit
