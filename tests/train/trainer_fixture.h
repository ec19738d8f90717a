// The fixture of the trainer tests: a scratch directory per test with a learnable token stream
// (a fixed random sequence of 97 tokens repeated, train and val shards), a small gpt2-tiny
// configuration that trains in a fraction of a second a step, a reader for the JSON log and a
// byte-for-byte comparison of two saves.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/cli/options/train_config.h"
#include "memfit/io/data/token_shard.h"
#include "../io/io_test_util.h"

namespace memfit::test {

class TrainerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = std::filesystem::temp_directory_path() /
          fmt::format("memfit_trainer_{}_{}_{}", ::getpid(), info->test_suite_name(), info->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "data");
    std::vector<uint16_t> base(97);
    uint32_t x = 12345;
    for (auto& t : base) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    std::vector<uint16_t> train, val;
    for (int i = 0; i < 80; ++i) train.insert(train.end(), base.begin(), base.end());
    for (int i = 0; i < 8; ++i) val.insert(val.end(), base.begin(), base.end());
    io::write_token_shard(dir / "data" / "train_000000.bin", train);
    io::write_token_shard(dir / "data" / "val_000000.bin", val);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  // gpt2-tiny or llama-tiny (both 512 tokens).
  TrainConfig config(const char* model = "gpt2-tiny") const {
    TrainConfig c;
    c.model = model;
    c.seq_len = 32;
    c.data_dir = (dir / "data").string();
    c.batch = 4;
    c.grad_accum = 2;
    c.steps = 6;
    c.schedule.lr = 3e-3f;
    c.schedule.min_lr = 3e-4f;
    c.schedule.warmup = 2;
    c.eval_every = 3;
    c.eval_batches = 2;
    return c;
  }
  static std::vector<nlohmann::json> read_log(const std::filesystem::path& file) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  // Two saves are byte for byte the same: weights, config, optimizer state and trainer state
  // (the offload tests' "bit-identical to the run in RAM").
  static void expect_same_checkpoint(const std::filesystem::path& a,
                                     const std::filesystem::path& b) {
    for (const char* f : {"model.safetensors", "config.json", "optimizer.safetensors",
                          "trainer_state.json"}) {
      EXPECT_TRUE(std::filesystem::exists(a / f) && std::filesystem::exists(b / f)) << f;
      EXPECT_EQ(io::testing::first_difference(a / f, b / f), "") << f;
    }
  }

  std::filesystem::path dir;
};

}  // namespace memfit::test
