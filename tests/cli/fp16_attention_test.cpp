// --precision fp16 with the default attention: flash has no fp16 kernel, so with --attention
// unset train and plan take plain and say so in one line; an explicit --attention flash is
// still refused naming both options, and other precisions keep flash.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

class Fp16Attention : public test::BinaryTest {
 protected:
  Fp16Attention() : BinaryTest(13) {}
  std::string tiny() const {
    return fmt::format("--model gpt2-tiny --seq-len 32 --batch 2 --threads 1 --eval-batches 1 "
                       "--data '{}'",
                       (dir / "data").string());
  }
  std::string out() const { return test::slurp(dir / "out.txt"); }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

constexpr const char* kSaid = "memfit: --precision fp16: --attention plain";

TEST_F(Fp16Attention, TheDefaultFallsBackToPlainAndSaysSo) {
  const auto ck = dir / "ck";
  ASSERT_EQ(run_memfit(fmt::format("train {} --precision fp16 --steps 2 --save '{}'", tiny(),
                                   ck.string())),
            0)
      << err();
  EXPECT_NE(err().find(kSaid), std::string::npos) << err();
  const nlohmann::json state = nlohmann::json::parse(test::slurp(ck / "trainer_state.json"));
  EXPECT_EQ(state["attention"], "plain");
  EXPECT_EQ(state["precision"], "fp16");
  // plan too (the line on stderr, so --json stays one object).
  ASSERT_EQ(run_memfit(fmt::format("plan {} --precision fp16 --json", tiny())), 0) << err();
  EXPECT_EQ(nlohmann::json::parse(out())["attention"], "plain");
}

TEST_F(Fp16Attention, AnExplicitFlashIsRefusedAndOtherPrecisionsKeepFlash) {
  EXPECT_EQ(run_memfit(fmt::format("train {} --precision fp16 --attention flash --steps 1",
                                   tiny())),
            2);
  EXPECT_NE(err().find("--attention flash runs in fp32 and bf16"), std::string::npos) << err();
  EXPECT_EQ(err().find(kSaid), std::string::npos) << err();
  ASSERT_EQ(run_memfit(fmt::format("plan {} --precision bf16 --json", tiny())), 0) << err();
  EXPECT_EQ(nlohmann::json::parse(out())["attention"], "flash");
  EXPECT_EQ(err().find(kSaid), std::string::npos) << err();
}

}  // namespace
}  // namespace memfit
