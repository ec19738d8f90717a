// The step's loss with loss masks (train/masked_loss.h): the denominator is the masked-in
// targets of all the step's micro-batches over every rank; the seed per target carries the
// loss scale and what the update divides by; the step loss is sum / targets (0 with none);
// without masks, the mean of the micro-batch means as before. And one trainer run on masked
// data: an all-ones mask trains as the same data without masks (same mean, same denominator).
#include "memfit/train/masked_loss.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "memfit/cli/options/train_from_config.h"
#include "memfit/io/data/loss_mask.h"
#include "memfit/io/data/token_shard.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class MaskedLoss : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("memfit_masked_loss_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "masked");
    fs::create_directories(dir_ / "plain");
    fs::create_directories(dir_ / "ones");
    std::vector<uint16_t> t(4001);
    std::vector<uint8_t> m(t.size()), ones(t.size(), 1);
    uint32_t x = 5;
    for (size_t i = 0; i < t.size(); ++i) {
      t[i] = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
      m[i] = (i % 5) < 2;
    }
    for (const char* d : {"masked", "plain", "ones"})
      io::write_token_shard(dir_ / d / "train_000000.bin", t);
    io::write_loss_mask(dir_ / "masked" / "train_000000.mask", m);
    io::write_loss_mask(dir_ / "ones" / "train_000000.mask", ones);
  }
  void TearDown() override { fs::remove_all(dir_); }
  io::DataLoaderOptions options() {
    io::DataLoaderOptions o;
    o.batch_size = 2;
    o.seq_len = 10;
    return o;
  }
  fs::path dir_;
  MemoryPool pool_;
};

TEST_F(MaskedLoss, TheDenominatorIsTheStepsMaskedInTargets) {
  io::DataLoader data = io::DataLoader::train(pool_, dir_ / "masked", options());
  data.set_position(3);
  const StepLoss s = step_loss_begin(data, 4, 8, 2.0f);
  EXPECT_TRUE(s.masked);
  // Micro-batches 3..6: windows 6..13, targets 10 w + 1 .. 10 w + 10: 4 of every 10 masked in.
  EXPECT_EQ(s.targets, 8 * 4);
  EXPECT_EQ(s.dloss, 2.0f * 8 / 32);
  EXPECT_EQ(data.position(), 3);  // counting reads no batch
  EXPECT_FLOAT_EQ(step_loss_mean(64.0, s, 8), 2.0f);
  StepLoss none = s;
  none.targets = 0;
  EXPECT_EQ(step_loss_mean(5.0, none, 8), 0.0f);

  io::DataLoader plain = io::DataLoader::train(pool_, dir_ / "plain", options());
  const StepLoss u = step_loss_begin(plain, 4, 8, 2.0f);
  EXPECT_FALSE(u.masked);
  EXPECT_EQ(step_loss_mean(12.0, u, 8), static_cast<float>(12.0 / 8));
}

TEST_F(MaskedLoss, AnAllOnesMaskTrainsAsNoMask) {
  auto run = [&](const char* d) {
    TrainConfig c;
    c.model = "gpt2-tiny";
    c.n_layer = 1;
    c.seq_len = 16;
    c.batch = 2;
    c.grad_accum = 2;
    c.steps = 3;
    c.threads = 1;
    c.data_dir = (dir_ / d).string();
    return train(c).losses;
  };
  const std::vector<float> plain = run("plain"), ones = run("ones");
  ASSERT_EQ(plain.size(), 3u);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(ones[i], plain[i], 1e-5 * std::abs(plain[i])) << "step " << i + 1;
}

}  // namespace
}  // namespace memfit
