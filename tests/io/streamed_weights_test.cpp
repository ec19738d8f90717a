// The streamed save of the weights of record (Note [Streamed save]): from runs of the layout
// cut anywhere (mid-row of a transposed Conv1D weight, mid-padding, a few elements) and a staging
// buffer of any size down to one element, model.safetensors (and shards with their index) are
// the bytes save_weights writes from the same slab in RAM; inside save_checkpoint a stream that
// fails leaves the previous checkpoint as it was; a scatter pass that misses bytes or writes
// outside a tensor is refused and leaves no file.
#include "memfit/io/checkpoint/streamed_weights.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "checkpoint_test_util.h"
#include "io_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using namespace testing;  // ScratchDir, list_dir, make_slab, fill, first_difference

ModelConfig config_of(const char* preset) {
  ModelConfig c = ModelConfig::preset(preset);
  c.vocab_size = 500;  // padding rows the save drops
  c.finalize();
  return c;
}

// A slab in RAM as a record stream, in runs of at most `run` elements (pseudo-random lengths
// from 1 to `run` when `ragged`), each copied to a buffer of its own so that nothing outside the
// run can be read. Counts the runs.
RecordStream runs_of(const Tensor& slab, int64_t run, bool ragged, int* calls = nullptr) {
  return [&slab, run, ragged, calls](ElementRange range, const RecordTake& take) {
    const size_t elem = dtype_size(slab.dtype());
    uint32_t x = 7;
    for (int64_t a = range.begin; a < range.end;) {
      int64_t n = run;
      if (ragged) n = 1 + static_cast<int64_t>((x = x * 1103515245u + 12345u) >> 8) % run;
      const int64_t b = std::min(range.end, a + n);
      std::vector<std::byte> copy(static_cast<size_t>(b - a) * elem);
      std::memcpy(copy.data(), static_cast<const std::byte*>(slab.raw_data()) + a * elem,
                  copy.size());
      take(a, b, copy.data());
      if (calls) ++*calls;
      a = b;
    }
  };
}

void expect_same_dirs(const fs::path& a, const fs::path& b) {
  ASSERT_EQ(list_dir(a), list_dir(b));
  for (const std::string& f : list_dir(a)) EXPECT_EQ(first_difference(a / f, b / f), "") << f;
}

TEST(StreamedWeights, TheSameBytesAsTheSaveFromRamWhateverTheRunsAndTheStaging) {
  int cases = 0;
  for (const char* preset : {"gpt2-tiny", "llama-tiny"})
    for (DType dtype : {DType::f32, DType::bf16}) {
      const ModelConfig c = config_of(preset);
      const ParamLayout layout(c);
      EXPECT_EQ(has_transposed_weights(c, layout), c.family == Family::gpt2);
      MemoryPool pool;
      Tensor slab = make_slab(pool, layout, dtype);
      fill(slab, 3);
      // Sharded: about four files (a shard is a run of tensors read with one stream).
      const uint64_t whole = static_cast<uint64_t>(layout.total()) * dtype_size(dtype);
      for (uint64_t max_shard : {kDefaultMaxShardBytes, whole / 4}) {
        ScratchDir ram, streamed;
        WeightsSaveOptions o;
        o.max_shard_bytes = max_shard;
        save_weights(ram.path(), c, layout, slab, o);
        struct Cut {
          int64_t run;
          bool ragged;
          int64_t staging;  // elements
        };
        for (const Cut& cut : {Cut{layout.total(), false, 1 << 20}, Cut{3001, false, 7},
                               Cut{5000, true, 1}, Cut{777, true, 100000}}) {
          SCOPED_TRACE(fmt::format("{} {} shard {} runs {}{} staging {}", preset,
                                   dtype_name(dtype), max_shard, cut.run,
                                   cut.ragged ? " ragged" : "", cut.staging));
          const bool sharded = max_shard != kDefaultMaxShardBytes;
          if (cut.staging == 1 && (dtype != DType::bf16 || sharded))
            continue;  // a write per element: once per family is enough
          if (sharded && cut.run == layout.total()) continue;  // (each save fsyncs its files)
          fs::remove_all(streamed.path());
          fs::create_directories(streamed.path());
          StreamedWeights w;
          w.dtype = dtype;
          int calls = 0;
          w.stream = runs_of(slab, cut.run, cut.ragged, &calls);
          w.staging = Tensor::empty(pool, {cut.staging}, dtype, Category::staging, "staging");
          save_weights_streamed(streamed.path(), c, layout, w, o);
          expect_same_dirs(ram.path(), streamed.path());
          EXPECT_GT(calls, 0);
          ++cases;
        }
      }
    }
  EXPECT_EQ(cases, 2 * (5 + 6));
}

// Inside the checkpoint's atomic save: a stream that fails half way leaves the previous
// checkpoint whole and no temporary file; a stream that completes is the save from RAM.
TEST(StreamedWeights, AFailedStreamLeavesThePreviousCheckpoint) {
  ScratchDir root;
  const ModelConfig c = config_of("gpt2-tiny");
  const ParamLayout layout(c);
  MemoryPool pool;
  Tensor before = make_slab(pool, layout), now = make_slab(pool, layout);
  fill(before, 1);
  fill(now, 2);
  const fs::path ck = root / "ck", ram = root / "ram";
  save_checkpoint(ck, c, layout, before);
  save_checkpoint(ram, c, layout, now);
  const std::vector<std::string> files = list_dir(ck);
  const std::string model_before = read_file(ck / "model.safetensors");
  Tensor staging = Tensor::empty(pool, {1000}, DType::f32, Category::staging, "staging");
  CheckpointSaveOptions o;
  StreamedWeights w;
  w.dtype = DType::f32;
  w.staging = staging;
  const RecordStream whole = runs_of(now, 4096, false);
  w.stream = [&](ElementRange range, const RecordTake& take) {
    int runs = 0;
    whole(range, [&](int64_t from, int64_t to, const void* src) {
      if (++runs == 5) MEMFIT_THROW(IoError, "test", "the disk went away");
      take(from, to, src);
    });
  };
  o.streamed_weights = w;
  EXPECT_NE(error_of([&] { save_checkpoint(ck, c, layout, Tensor{}, o); }).find("went away"),
            std::string::npos);
  EXPECT_EQ(list_dir(ck), files);
  EXPECT_EQ(read_file(ck / "model.safetensors"), model_before);
  EXPECT_EQ(list_dir(root.path()), (std::vector<std::string>{"ck", "ram"}));
  w.stream = whole;
  o.streamed_weights = w;
  save_checkpoint(ck, c, layout, Tensor{}, o);
  expect_same_dirs(ram, ck);
}

// The writer checks the scatter pass: every byte of every scattered tensor, none outside.
TEST(StreamedWeights, AScatterPassThatMissesBytesOrWritesOutsideIsRefused) {
  ScratchDir root;
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  using Pass = std::function<void(const SafetensorsWriter::ScatterSink&)>;
  auto write = [&](const Pass& pass) {
    SafetensorsWriter w;
    EXPECT_EQ(w.add_scattered("a", SafetensorsDType::F32, {2, 3}), 0u);
    w.add_raw("b", SafetensorsDType::F32, {2}, data.data());
    w.set_scatter(pass);
    w.write(root / "x.safetensors");
  };
  // Backwards, one element at a time: the same file as written in order.
  write([&](const SafetensorsWriter::ScatterSink& sink) {
    for (int i = 5; i >= 0; --i) sink(0, static_cast<uint64_t>(i) * 4, &data[i], 4);
  });
  SafetensorsReader r(root / "x.safetensors");
  MemoryPool pool;
  Tensor back = Tensor::empty(pool, {2, 3}, DType::f32, Category::staging, "back");
  r.read("a", back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back.data<float>()[i], data[i]);
  fs::remove(root / "x.safetensors");
  auto refused = [&](const Pass& pass) {
    try {
      write(pass);
    } catch (const Error& e) {
      EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{});
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused([&](const auto& sink) { sink(0, 0, data.data(), 20); })
                .find("wrote 20 of its 24 bytes"),
            std::string::npos);
  EXPECT_NE(refused([&](const auto& sink) { sink(0, 4, data.data(), 24); })
                .find("lies outside its 24 bytes"),
            std::string::npos);
  EXPECT_NE(refused([&](const auto& sink) { sink(1, 0, data.data(), 4); })
                .find("not a scattered one"),
            std::string::npos);
}

}  // namespace
}  // namespace memfit::io
