// Gradients on disk (offload/offloaded_grads.h; Note [NVMe offload], "Gradients on disk"): the
// file's units start on pages past the header and do not overlap; the RAM is a fraction of the
// slab for a large model; simulated micro-batches accumulate through the file (each block read
// back before its next backward) and the update's piece reads return the sums, at any piece
// offset; the file is scratch with a header naming the run and is removed at the end.
#include "memfit/offload/offloaded_grads.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/model/model_config.h"
#include "memfit/state/shard.h"
#include "../support/scoped_env.h"

namespace memfit::offload {
namespace {

namespace fs = std::filesystem;

TEST(GradFileLayout, UnitsOnTheirOwnPagesAndLlama7bHoldsAFractionOfTheSlab) {
  ModelConfig mc = ModelConfig::preset("llama2-7b");
  mc.finalize();
  const ParamLayout layout(mc);
  for (int accum : {1, 2}) {
    const GradFileLayout g = make_grad_file_layout(layout, accum);
    ASSERT_EQ(g.units.size(), static_cast<size_t>(mc.n_layer) + 2);
    uint64_t end = kHeaderBytes;
    for (size_t u = 0; u < g.units.size(); ++u) {
      EXPECT_EQ(g.file_offsets[u] % kIoAlign, 0u);
      EXPECT_GE(g.file_offsets[u], end);
      end = g.file_offsets[u] + static_cast<uint64_t>(g.units[u].size()) * 4;
    }
    EXPECT_GE(g.file_bytes, end);
    EXPECT_EQ(g.block_slots, accum > 1 ? 3 : 2);
    // 25.7 GiB of slab; the buffers: the embeddings, the tail and two or three blocks.
    const size_t slab = static_cast<size_t>(layout.total()) * 4;
    EXPECT_LT(g.ram_bytes(), slab / (accum > 1 ? 7 : 9));
    EXPECT_GT(g.ram_bytes(), g.edge_bytes + g.tail_bytes + g.block_slots * g.slot_bytes);
  }
  // Accumulation adds each block's write and read back per extra micro-batch.
  const GradFileLayout one = make_grad_file_layout(layout, 1),
                       two = make_grad_file_layout(layout, 2);
  const std::vector<ElementRange> none;
  uint64_t blocks = 0;
  for (size_t u = 1; u + 1 < one.units.size(); ++u)
    blocks += align_up(static_cast<size_t>(one.units[u].size()) * 4);
  EXPECT_EQ(two.io_bytes_per_step(none) - one.io_bytes_per_step(none), 2 * blocks);
  EXPECT_EQ(one.io_bytes_per_step(none), one.file_bytes - kHeaderBytes);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("memfit_offload_grads_{}", ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Micro-batch m adds (m + 1) * (1 + element index % 7) to every element of every unit, each
// block inside its backward, the edges at any time of the micro-batch.
float integers(int m, int64_t e) { return float((m + 1) * (1 + e % 7)); }

void run_step(OffloadedGrads& g, const ParamLayout& layout, int accum,
              float (*value)(int m, int64_t e) = integers) {
  const std::vector<ElementRange> units = unit_ranges(layout);
  auto add = [&](const Tensor& t, int64_t base, int m) {
    if (!t.defined()) return;
    float* p = const_cast<Tensor&>(t).data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] += value(m, base + i);
  };
  auto add_param = [&](const Tensor& t, const std::string& name, int m) {
    if (t.defined()) add(t, layout.find(name).offset, m);
  };
  g.zero();
  const int L = static_cast<int>(units.size()) - 2;
  for (int m = 0; m < accum; ++m) {
    g.begin_micro_batch();
    add_param(g.views().tok_emb, layout.params().front().name, m);
    g.done(L);
    for (int l = L - 1; l >= 0; --l) {
      g.enter_backward(l);
      const BlockWeights& b = g.views().blocks[static_cast<size_t>(l)];
      for (const ParamInfo& p : layout.params())
        if (p.layer == l && p.name.find("attn.c_attn.weight") != std::string::npos)
          add(b.qkv_w, p.offset, m);
      g.done(l);
    }
    g.done(-1);
  }
}

TEST(OffloadedGrads, AccumulatesThroughTheFileAndTheUpdateReadsAnyPiece) {
  // Both engines: the trainer tests run io_uring.
  const test::ScopedEnv env("MEMFIT_OFFLOAD_IO", "threads");
  TempDir dir;
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.finalize();
  const ParamLayout layout(mc);
  MemoryPool pool;
  {
    OffloadedGrads g(layout, pool, dir.path, "run-x", /*grad_accum=*/3, DType::f32,
                     /*max_piece=*/1000);
    const nlohmann::json h = ScratchFile::read_header(g.file().path());
    EXPECT_EQ(h["run"], "run-x");
    EXPECT_EQ(h["tensor"], "grads");
    EXPECT_EQ(h["layout"]["unit_starts"]["count"], unit_ranges(layout).size());
    EXPECT_EQ(pool.bytes_current(), g.file_layout().ram_bytes());
    run_step(g, layout, 3);
    // The qkv weight of each block: (1 + 2 + 3) * (1 + e % 7) after three micro-batches, read
    // by the update in pieces of 1000 starting anywhere in the unit (here: not on a page).
    for (const ParamInfo& p : layout.params()) {
      if (p.layer < 0 || p.name.find("attn.c_attn.weight") == std::string::npos) continue;
      const ElementRange piece{p.offset + 3, std::min(p.offset + 1003, p.offset + p.numel)};
      g.submit_piece(piece, 1);
      const Tensor t = g.wait_piece(piece, 1);
      const float* v = t.data<float>();
      for (int64_t i = 0; i < piece.size(); ++i)
        ASSERT_EQ(v[i], float(6 * (1 + (piece.begin + i) % 7))) << p.name << " " << i;
    }
    // The embeddings, written once after the last backward.
    const ParamInfo& e = layout.params().front();
    const ElementRange piece{e.offset, e.offset + 999};
    g.submit_piece(piece, 0);
    const Tensor t = g.wait_piece(piece, 0);
    for (int64_t i = 0; i < piece.size(); ++i)
      ASSERT_EQ(t.data<float>()[i], float(6 * (1 + (piece.begin + i) % 7))) << i;
    // A second step starts from zero.
    run_step(g, layout, 3);
    g.submit_piece(piece, 2);
    EXPECT_EQ(g.wait_piece(piece, 2).data<float>()[5], float(6 * (1 + (piece.begin + 5) % 7)));
    EXPECT_EQ(g.stats().bytes_written, 2 * (g.file_layout().file_bytes - kHeaderBytes +
                                            2 * (g.file_layout().file_bytes - kHeaderBytes -
                                                 align_up(g.file_layout().units.front().size() * 4) -
                                                 align_up(g.file_layout().units.back().size() * 4))));
  }
  EXPECT_TRUE(fs::is_empty(dir.path));  // scratch: removed
}

// Values bf16 cannot hold (8 significant bits): each micro-batch's rounding shows.
float fractions(int m, int64_t e) {
  return float((m + 1) * (1 + e % 7)) + float(e % 5) * 0.0078125f + float(m) * 0.01f;
}

// --grad-dtype bf16: the file holds bf16 sums, half the f32 file's bytes; micro-batch 0's f32
// sums are rounded once, each later micro-batch's rounded and added to the sums so far in f32,
// rounded once (UnitGrads' sums in one process); the update reads them as bf16 at any offset.
TEST(OffloadedGrads, Bf16SumsRoundEachMicroBatchOnceAndAddInF32) {
  TempDir dir;
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.finalize();
  const ParamLayout layout(mc);
  MemoryPool pool;
  const GradFileLayout f32 = make_grad_file_layout(layout, 3);
  {
    OffloadedGrads g(layout, pool, dir.path, "run-b", /*grad_accum=*/3, DType::bf16,
                     /*max_piece=*/1000);
    const GradFileLayout& fl = g.file_layout();
    EXPECT_EQ(ScratchFile::read_header(g.file().path())["dtype"], "BF16");
    EXPECT_EQ(fs::file_size(g.file().path()), fl.file_bytes);  // what the plan's disk counts
    EXPECT_EQ(pool.bytes_current(), fl.ram_bytes());
    EXPECT_LT(fl.file_bytes - kHeaderBytes, (f32.file_bytes - kHeaderBytes) / 2 +
                                                 fl.units.size() * kIoAlign);
    EXPECT_GT(fl.edge_sums_bytes, 0u);
    EXPECT_GT(fl.read_bytes, 0u);
    auto expected = [](int64_t e) {
      uint16_t s = bf16_from_f32(fractions(0, e));
      for (int m = 1; m < 3; ++m)
        s = bf16_from_f32(f32_from_bf16(s) + f32_from_bf16(bf16_from_f32(fractions(m, e))));
      return s;
    };
    for (int step = 0; step < 2; ++step) {  // the second starts from zero again
      run_step(g, layout, 3, fractions);
      int rounded = 0;
      for (const ParamInfo& p : layout.params()) {
        const bool qkv = p.layer >= 0 && p.name.find("attn.c_attn.weight") != std::string::npos;
        if (!qkv && p.layer >= 0) continue;  // the qkv weights and the embeddings
        if (p.layer < 0 && &p != &layout.params().front()) continue;
        const ElementRange piece{p.offset + 3, std::min(p.offset + 1003, p.offset + p.numel)};
        g.submit_piece(piece, step);
        const Tensor t = g.wait_piece(piece, step);
        ASSERT_EQ(t.dtype(), DType::bf16);
        const uint16_t* v = static_cast<const uint16_t*>(t.raw_data());
        for (int64_t i = 0; i < piece.size(); ++i) {
          ASSERT_EQ(v[i], expected(piece.begin + i)) << p.name << " " << i;
          rounded += f32_from_bf16(v[i]) != fractions(0, piece.begin + i) +
                                                fractions(1, piece.begin + i) +
                                                fractions(2, piece.begin + i);
        }
      }
      EXPECT_GT(rounded, 0);  // the test's values do round
    }
    // Every block written per micro-batch and read back by micro-batches 1 and 2, the edges
    // written once: the layout's bytes, in bf16.
    const std::vector<ElementRange> none;
    EXPECT_EQ(g.backward_bytes(), 2 * fl.io_bytes_per_step(none));
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
}

// A failed write of a unit's gradients (fault injection: the first request is the tail's write,
// the step's only micro-batch being its last) stops the backward with the file, the offset and errno; the file is still removed.
TEST(OffloadedGrads, AWriteErrorNamesTheFileOffsetAndErrno) {
  TempDir dir;
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.finalize();
  const ParamLayout layout(mc);
  MemoryPool pool;
  {
    OffloadedGrads g(layout, pool, dir.path, "run-e", /*grad_accum=*/1);
    const test::ScopedEnv fail("MEMFIT_OFFLOAD_FAIL_IO", "1:ENOSPC");
    try {
      run_step(g, layout, 1);
      ADD_FAILURE() << "no error";
    } catch (const IoError& e) {
      const std::string what = e.what();
      const std::vector<ElementRange> units = unit_ranges(layout);
      EXPECT_NE(what.find("run-e.grads.offload"), std::string::npos) << what;
      EXPECT_NE(what.find(fmt::format("offset {}", g.file_layout().file_offsets[units.size() - 1])),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("errno 28"), std::string::npos) << what;
    }
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
}

}  // namespace
}  // namespace memfit::offload
