// The offload directory's disk rates: measured with real reads and writes, cached per filesystem
// in the calibration cache and read back from it; and the step-time model adds only the I/O
// time the update's compute does not hide.
#include "memfit/offload/disk_rate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "memfit/plan/step_time.h"
#include "../support/scoped_env.h"

namespace memfit::offload {
namespace {

namespace fs = std::filesystem;

TEST(DiskRate, MeasuresCachesAndReadsBack) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("memfit_disk_rate_{}", ::getpid());
  fs::remove_all(dir);
  const test::ScopedEnv cache("MEMFIT_CACHE_DIR", (dir / "cache").string());
  const DiskRate m = measure_disk_rate(dir / "off", 1 << 20);
  EXPECT_GT(m.read_bytes_per_s, 0);
  EXPECT_GT(m.write_bytes_per_s, 0);
  EXPECT_EQ(m.bytes, 1u << 20);
  EXPECT_DOUBLE_EQ(m.seconds(m.read_bytes_per_s, 2 * m.write_bytes_per_s), 3.0);
  // The test made no directory (its file went in the nearest existing ancestor, the temporary
  // directory, so ranks measuring at once race on no directory) and its file is gone.
  EXPECT_FALSE(fs::exists(dir / "off"));
  EXPECT_FALSE(fs::exists(fs::temp_directory_path() /
                          fmt::format("memfit-disk-test-{}.offload", ::getpid())));
  const DiskRate& a = disk_rate(dir / "off");
  const DiskRate& b = disk_rate(dir / "off");
  EXPECT_EQ(&a, &b);  // remembered in the process
  bool cached = false;
  for (const auto& e : fs::directory_iterator(dir / "cache"))
    cached |= e.path().filename().string().rfind("disk-", 0) == 0;
  EXPECT_TRUE(cached);
  fs::remove_all(dir);
}

TEST(DiskRate, StepTimeAddsOnlyTheIoTheUpdateDoesNotHide) {
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.finalize();
  StepTimeInputs in;
  in.model = mc;
  in.B = 2;
  in.T = 32;
  in.param_count = 1000000;
  in.optimizer_bytes = 8000000;
  Calibration rates;
  rates.gemm = {{96, 1e11, 1e11, 1e11, 1e11}};
  rates.attention_f32 = rates.attention_bf16 = 1e11;
  rates.elementwise_bytes_per_s = 1e10;
  rates.stream_bytes_per_s = 1e10;
  rates.copy_bytes_per_s = 1e10;
  const StepTime none = estimate_step_time(in, rates);
  EXPECT_EQ(none.offload_io, 0);
  in.offload_io_seconds = none.optimizer / 2;  // hidden behind the update's compute
  EXPECT_EQ(estimate_step_time(in, rates).offload_io, 0);
  in.offload_io_seconds = none.optimizer + 1.5;  // the disk is the bottleneck
  const StepTime slow = estimate_step_time(in, rates);
  EXPECT_DOUBLE_EQ(slow.offload_io, 1.5);
  EXPECT_DOUBLE_EQ(slow.total(), none.total() + 1.5);
}

}  // namespace
}  // namespace memfit::offload
