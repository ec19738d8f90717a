// Chat data through the memfit binary: `memfit prepare --format chat` on a small JSONL file
// writes token and loss-mask shards, `memfit train` on them runs and evaluates; the step's loss
// is the mean over the step's masked-in targets however the batch is cut into micro-batches
// (batch 4 = batch 2 x grad-accum 2), and so is the validation loss over the same 8 val
// windows (2 batches of 4 = 4 batches of 2); the plan equals the measured peak; a window other than
// the one prepared and a malformed record exit 2 naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

template <class Base>
class ChatFixture : public Base {
 protected:
  using Base::dir;
  using Base::run_memfit;
  ChatFixture() : Base(77) {}
  void SetUp() override {
    Base::SetUp();
    if (::testing::Test::IsSkipped()) return;
    std::ofstream out(dir / "chat.jsonl");
    for (int i = 0; i < 24; ++i) {
      // Answers of different lengths, so windows hold different numbers of trained tokens.
      json r = {{"messages",
                 {{{"role", "system"}, {"content", "Add."}},
                  {{"role", "user"}, {"content", fmt::format("What is {} + {}?", i, 2 * i)}},
                  {{"role", "assistant"},
                   {"content", fmt::format("{} + {} is {}{}", i, 2 * i, 3 * i,
                                           std::string(static_cast<size_t>(i % 5) * 3, '!'))}}}}};
      out << r.dump() << "\n";
    }
  }
  std::string prepare(const std::string& more = "") const {
    return fmt::format("prepare --input '{}' --out '{}' --format chat --template chatml "
                       "--tokenizer byte --seq-len 128 --val-fraction 0.34 {}",
                       (dir / "chat.jsonl").string(), (dir / "chat").string(), more);
  }
  std::string train(const std::string& more) const {
    return fmt::format("train --model gpt2-tiny --data '{}' --seq-len 128 --steps 3 "
                       "--eval-every 3 --threads 1 --shuffle false {}",
                       (dir / "chat").string(), more);
  }
  std::vector<json> log_lines(const fs::path& log) const {
    std::vector<json> out;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);)
      if (json j = json::parse(line); j.contains("step")) out.push_back(j);
    return out;
  }
  std::string out() const { return test::slurp(dir / "out.txt"); }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

using ChatData = ChatFixture<test::BinaryTest>;
using ChatDataTwoRanks = ChatFixture<test::MpiBinaryTest>;

TEST_F(ChatData, PrepareThenTrainOnTheMaskedTokens) {
  ASSERT_EQ(run_memfit(prepare()), 0) << err();
  EXPECT_NE(out().find("chatml template, 24 records"), std::string::npos) << out();
  EXPECT_TRUE(fs::exists(dir / "chat" / "train_000000.mask"));
  EXPECT_TRUE(fs::exists(dir / "chat" / "val_000000.mask"));

  const fs::path a = dir / "a.jsonl", b = dir / "b.jsonl";
  ASSERT_EQ(run_memfit(train(fmt::format("--batch 4 --eval-batches 2 --log '{}'", a.string()))),
            0)
      << err();
  ASSERT_EQ(run_memfit(train(fmt::format("--batch 2 --grad-accum 2 --eval-batches 4 --log '{}'",
                                               b.string()))), 0)
      << err();
  const std::vector<json> one = log_lines(a), two = log_lines(b);
  ASSERT_EQ(one.size(), two.size());
  int steps = 0, evals = 0;
  for (size_t i = 0; i < one.size(); ++i)
    for (const char* key : {"loss", "val_loss"}) {
      if (!one[i].contains(key)) continue;
      const double x = one[i][key], y = two[i][key];
      EXPECT_TRUE(std::isfinite(x) && x > 0) << key;
      EXPECT_LE(std::abs(x - y), 2e-5 * std::abs(x)) << key << " at step " << one[i]["step"];
      (std::string(key) == "loss" ? steps : evals) += 1;
    }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(evals, 1);

  // Planned = measured with the masks' staging.
  ASSERT_EQ(run_memfit(fmt::format("plan --model gpt2-tiny --data '{}' --seq-len 128 --batch 2 "
                                   "--grad-accum 2 --steps 3 --eval-batches 4 --threads 1 "
                                   "--shuffle false --json",
                                   (dir / "chat").string())),
            0)
      << err();
  const json plan = json::parse(out());
  size_t peak = 0;
  std::ifstream in(b);
  for (std::string line; std::getline(in, line);)
    if (json j = json::parse(line); j.contains("peak_bytes"))
      peak = std::max(peak, j["peak_bytes"].get<size_t>());
  EXPECT_EQ(peak, plan["peak_bytes"].get<size_t>());
}

TEST_F(ChatData, AnotherWindowOrAMalformedRecordExitsTwo) {
  ASSERT_EQ(run_memfit(prepare()), 0) << err();
  EXPECT_EQ(run_memfit("train --model gpt2-tiny --seq-len 64 --steps 1 --batch 1 --threads 1 "
                       "--data '" + (dir / "chat").string() + "'"),
            2);
  EXPECT_NE(err().find("--seq-len 128"), std::string::npos) << err();

  std::ofstream(dir / "chat.jsonl", std::ios::app)
      << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]})"
      << "\n";
  EXPECT_EQ(run_memfit(prepare("--overwrite")), 2);
  EXPECT_NE(err().find((dir / "chat.jsonl").string() + ":25: field messages[1].role: unknown "
                                                       "role \"robot\""),
            std::string::npos)
      << err();
}

// Two ranks of batch 2 train as one process of batch 4: each rank counts the masked-in targets
// of the whole global micro-batch, so both divide by the same M.
TEST_F(ChatDataTwoRanks, TwoRanksTrainAsOneProcessWithTwiceTheBatch) {
  ASSERT_EQ(run_memfit(prepare()), 0) << err();
  const fs::path a = dir / "one.jsonl", b = dir / "two.jsonl";
  ASSERT_EQ(run_memfit(train(fmt::format("--batch 4 --eval-batches 2 --log '{}'", a.string()))),
            0)
      << err();
  ASSERT_EQ(run_memfit(train(fmt::format("--batch 2 --eval-batches 2 --log '{}'", b.string())), 2),
            0)
      << err();
  const std::vector<json> one = log_lines(a), two = log_lines(b);
  ASSERT_EQ(one.size(), two.size());
  int compared = 0;
  for (size_t i = 0; i < one.size(); ++i)
    for (const char* key : {"loss", "val_loss"}) {
      if (!one[i].contains(key)) continue;
      const double x = one[i][key], y = two[i][key];
      EXPECT_LE(std::abs(x - y), 2e-5 * std::abs(x)) << key << " at step " << one[i]["step"];
      ++compared;
    }
  EXPECT_EQ(compared, 4);
}

}  // namespace
}  // namespace memfit
