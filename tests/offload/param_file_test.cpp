// The working weights' file (--offload-params, Note [NVMe offload]): the blocks, and only they,
// at aligned extents past a header page, the persistent units (embeddings, tail, blocks under
// the threshold) in RAM; the header names the run, the layout and the step; a block written
// through an aligned buffer reads back the same; the I/O per step is the micro-batches' block
// reads and the update's write-back (and its reads without master weights); the file is
// removed with the object.
#include "memfit/offload/param_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "memfit/model/model_config.h"
#include "memfit/model/step_plan.h"
#include "memfit/offload/offload_layout.h"

namespace memfit::offload {
namespace {

namespace fs = std::filesystem;

TEST(ParamFileLayout, BlocksAlignedAfterTheHeaderPersistentUnitsInRam) {
  const ParamLayout layout(ModelConfig::preset("llama-tiny"));
  for (DType dt : {DType::f32, DType::bf16}) {
    const ParamFileLayout L = make_param_file_layout(layout, dt, 0);
    ASSERT_GE(L.units.size(), 3u);
    EXPECT_FALSE(L.in_file(0));
    EXPECT_FALSE(L.in_file(L.units.size() - 1));
    uint64_t at = kHeaderBytes;
    for (size_t u = 1; u + 1 < L.units.size(); ++u) {
      ASSERT_TRUE(L.in_file(u));
      EXPECT_EQ(static_cast<uint64_t>(L.offsets[u]), at);
      EXPECT_EQ(L.request_bytes(u) % kIoAlign, 0u);
      EXPECT_GE(L.request_bytes(u), static_cast<uint64_t>(L.units[u].size()) * dtype_size(dt));
      at += L.request_bytes(u);
    }
    EXPECT_EQ(L.file_bytes, at);
    EXPECT_EQ(L.blocks_bytes(), at - kHeaderBytes);
    // A threshold above the block size keeps every block in RAM: a header alone.
    const ParamFileLayout none = make_param_file_layout(layout, dt, layout.total());
    EXPECT_EQ(none.file_bytes, kHeaderBytes);
  }
}

TEST(ParamFileLayout, IoPerStepFollowsTheGatherEvents) {
  const ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  const ParamLayout layout(mc);
  const StepPlan plan = plan_step(mc, 2, 16, {});
  const ParamFileLayout L = make_param_file_layout(layout, DType::bf16, 0);
  uint64_t per_micro_batch = 0;
  for (int u : gather_events(gather_units(layout, 0), plan.phases))
    per_micro_batch += L.request_bytes(static_cast<size_t>(u));
  // Without checkpointing the top block's forward and backward share one read: fewer reads than
  // two per block, more than one.
  EXPECT_LT(per_micro_batch, 2 * L.blocks_bytes());
  EXPECT_GT(per_micro_batch, L.blocks_bytes());
  const ParamIoBytes with_master =
      param_io_bytes_per_step(layout, DType::bf16, plan.phases, 3, 0, ParamUpdateIo::write);
  EXPECT_EQ(with_master.read, 3 * per_micro_batch);
  EXPECT_EQ(with_master.written, L.blocks_bytes());
  const ParamIoBytes without =
      param_io_bytes_per_step(layout, DType::bf16, plan.phases, 3, 0, ParamUpdateIo::read_write);
  EXPECT_EQ(without.read, 3 * per_micro_batch + L.blocks_bytes());
  EXPECT_EQ(without.written, L.blocks_bytes());
  // LoRA's frozen base (Note [LoRA], "The frozen base on disk"): the micro-batches' reads alone.
  const ParamIoBytes frozen =
      param_io_bytes_per_step(layout, DType::bf16, plan.phases, 3, 0, ParamUpdateIo::none);
  EXPECT_EQ(frozen.read, 3 * per_micro_batch);
  EXPECT_EQ(frozen.written, 0u);
}

TEST(ParamFile, HeaderRoundTripAndRemoval) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("memfit_param_file_{}", ::getpid());
  fs::remove_all(dir);
  const ParamLayout layout(ModelConfig::preset("gpt2-tiny"));
  fs::path path;
  {
    ParamFile f(layout, DType::bf16, 0, dir, "run-7");
    path = f.file().path();
    EXPECT_EQ(path.filename(), "run-7.params.offload");
    EXPECT_EQ(fs::file_size(path), f.layout().file_bytes);
    nlohmann::json h = ScratchFile::read_header(path);
    EXPECT_EQ(h["run"], "run-7");
    EXPECT_EQ(h["tensor"], "params");
    EXPECT_EQ(h["dtype"], "bf16");
    EXPECT_EQ(h["layout"]["elements"], layout.total());
    EXPECT_EQ(h["layout"]["block_starts"]["count"], f.layout().units.size() - 2);
    EXPECT_EQ(h["step"], 0);
    // Block 1 written from an aligned buffer, read back into another.
    const size_t bytes = f.layout().request_bytes(1);
    auto* out = static_cast<unsigned char*>(std::aligned_alloc(kIoAlign, bytes));
    auto* in = static_cast<unsigned char*>(std::aligned_alloc(kIoAlign, bytes));
    for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 7 + 3);
    std::memset(in, 0, bytes);
    f.wait(f.write(1, out));
    f.wait(f.read(1, in));
    EXPECT_EQ(std::memcmp(in, out, bytes), 0);
    EXPECT_EQ(f.bytes_written(), bytes);
    EXPECT_EQ(f.bytes_read(), bytes);
    std::free(out);
    std::free(in);
    f.set_step(5);
    EXPECT_EQ(ScratchFile::read_header(path)["step"], 5);
    // The embeddings are in RAM: not a unit of the file.
    EXPECT_THROW(f.read(0, nullptr), Error);
  }
  EXPECT_FALSE(fs::exists(path));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memfit::offload
