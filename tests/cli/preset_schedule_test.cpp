// A preset with a published schedule brings it (cli/options/preset_schedule.h): `train --model
// llama2-7b` (shrunk here to one 64-wide block) warms up over Meta's 2,000 steps to 3e-4 and
// says so at start; --lr on the command line and --warmup in a --config file win, each alone;
// a test-sized preset carries none and keeps the defaults, silently.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

class PresetSchedule : public test::BinaryTest {
 protected:
  PresetSchedule() : BinaryTest(11) {}
  // llama2-7b's family and schedule at a size that trains in a moment.
  std::string llama() const {
    return fmt::format("train --model llama2-7b --n-layer 1 --d-model 64 --n-head 2 "
                       "--n-kv-head 2 --ffn-dim 128 --vocab 512 --seq-len 32 --batch 2 "
                       "--steps 2 --threads 1 --eval-batches 1 --data '{}' --log '{}'",
                       (dir / "data").string(), (dir / "log.jsonl").string());
  }
  // The learning rate of each step in the log.
  std::vector<double> rates() const {
    std::vector<double> lr;
    std::istringstream lines(test::slurp(dir / "log.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("lr")) lr.push_back(j["lr"].get<double>());
    }
    return lr;
  }
  std::string out() const { return test::slurp(dir / "out.txt"); }
};

TEST_F(PresetSchedule, ThePresetsValuesApplyAndTheCommandLineWins) {
  ASSERT_EQ(run_memfit(llama()), 0) << test::slurp(dir / "err.txt");
  EXPECT_NE(out().find("memfit: preset llama2-7b: lr 0.0003, warmup 2000, min-lr 3e-05 (Llama 2 "
                       "paper"),
            std::string::npos)
      << out();
  std::vector<double> lr = rates();
  ASSERT_EQ(lr.size(), 2u);
  EXPECT_NEAR(lr[0], 3e-4 * 1 / 2000, 1e-12);  // linear warmup over 2,000 steps
  EXPECT_NEAR(lr[1], 3e-4 * 2 / 2000, 1e-12);

  // --lr wins; the warmup stays the preset's, and the line says which option won.
  ASSERT_EQ(run_memfit(llama() + " --lr 1e-3"), 0) << test::slurp(dir / "err.txt");
  EXPECT_NE(out().find("the command line wins: --lr 0.001"), std::string::npos) << out();
  lr = rates();
  ASSERT_EQ(lr.size(), 2u);
  EXPECT_NEAR(lr[0], 1e-3 * 1 / 2000, 1e-12);

  // A --config file's warmup wins too; the rate stays the preset's.
  const auto toml = dir / "run.toml";
  std::ofstream(toml) << "warmup = 4\n";
  ASSERT_EQ(run_memfit(llama() + fmt::format(" --config '{}'", toml.string())), 0)
      << test::slurp(dir / "err.txt");
  EXPECT_NE(out().find("the command line wins: --warmup 4"), std::string::npos) << out();
  lr = rates();
  ASSERT_EQ(lr.size(), 2u);
  EXPECT_NEAR(lr[0], 3e-4 * 1 / 4, 1e-10);
}

TEST_F(PresetSchedule, ATestSizedPresetKeepsTheDefaults) {
  ASSERT_EQ(run_memfit(fmt::format("train --model gpt2-tiny --seq-len 32 --batch 2 --steps 2 "
                                   "--threads 1 --eval-batches 1 --data '{}' --log '{}'",
                                   (dir / "data").string(), (dir / "log.jsonl").string())),
            0)
      << test::slurp(dir / "err.txt");
  EXPECT_EQ(out().find("preset "), std::string::npos) << out();
  const std::vector<double> lr = rates();
  ASSERT_EQ(lr.size(), 2u);
  EXPECT_NEAR(lr[0], 6e-4, 1e-9);  // --lr's default, no warmup
}

}  // namespace
}  // namespace memfit
