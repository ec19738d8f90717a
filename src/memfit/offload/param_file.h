// --offload-params nvme: the blocks' working weights in a scratch file, read into WeightGather's
// ring before the phase that needs them and written back by the update (the file source of
// dist/zero/weight_gather.h). Each block that is not persistent (the embeddings, the tail and
// blocks under --persist-threshold stay in RAM) has its own 4 KiB-aligned extent, so a block is
// one O_DIRECT request into one ring slot. The planner reads the same layout (file bytes, I/O
// per step). Note [NVMe offload], "Working weights on disk" (docs/notes/offload.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_schedule.h"
#include "memfit/dist/zero/weight_gather.h"
#include "memfit/offload/io_engine.h"
#include "memfit/offload/offloaded_optimizer.h"
#include "memfit/offload/scratch_file.h"

namespace memfit::offload {

struct ParamFileLayout {
  DType dtype = DType::f32;
  ElementRange range;               // the whole layout, or a ZeRO-3 rank's shard
  std::vector<ElementRange> units;  // unit_ranges(layout)
  std::vector<ElementRange> parts;  // each unit's elements in `range` (the file holds these)
  // Per unit: where its part starts in the file; -1 if in RAM (persistent) or empty.
  std::vector<int64_t> offsets;
  uint64_t file_bytes = 0;          // the header and every block's aligned extent

  bool in_file(size_t u) const { return offsets[u] >= 0; }
  // Unit u's request: its part's bytes rounded up to 4 KiB.
  uint64_t request_bytes(size_t u) const;
  // Every block in the file once (what the update writes, or reads without master weights).
  uint64_t blocks_bytes() const;
};
// `range`: the part of the layout whose working weights this file holds (a ZeRO-3 rank's shard,
// Note [ZeRO stage 3]); the whole layout when absent.
ParamFileLayout make_param_file_layout(const ParamLayout& layout, DType dtype,
                                       int64_t persist_threshold,
                                       std::optional<ElementRange> range = std::nullopt);

// What the update does to the file each step: writes every block back (with master weights),
// reads then writes every block (without: fp32, pure bf16, the update reads the weights it
// changes), or nothing (LoRA's frozen base, read only: Note [LoRA], "The frozen base on disk").
enum class ParamUpdateIo { write, read_write, none };

// The bytes read and written in one training step: each micro-batch's reads (gather_events of
// the step plan's phases: a block needed by adjacent phases is read once) and the update's
// (`update`): its write of every block, and with ParamUpdateIo::read_write its read of every
// block too unless the update runs in the backward (`in_backward`: each block stepped in the
// slot its backward read, Note [Update in backward]). `micro_batches`: the micro-batch passes a
// step runs (--grad-accum, twice that with global clipping in the backward).
struct ParamIoBytes {
  uint64_t read = 0, written = 0;
};
ParamIoBytes param_io_bytes_per_step(const ParamLayout& layout, DType dtype,
                                     const std::vector<Phase>& phases, int micro_batches,
                                     int64_t persist_threshold, ParamUpdateIo update,
                                     std::optional<ElementRange> range = std::nullopt,
                                     bool in_backward = false);

class ParamFile final : public UnitFile {
 public:
  // Creates DIR/<run>.params.offload (refusing a disk too small before creating it: IoError
  // with the bytes needed and free) and its own I/O engine.
  ParamFile(const ParamLayout& layout, DType dtype, int64_t persist_threshold,
            const std::filesystem::path& dir, const std::string& run,
            std::optional<ElementRange> range = std::nullopt);
  ~ParamFile() override;

  uint64_t read(size_t unit, void* dst) override;
  uint64_t write(size_t unit, const void* src) override;
  void wait(uint64_t ticket) override;
  void set_step(int64_t step) override { file_->set_step(step); }

  const ParamFileLayout& layout() const { return layout_; }
  const ScratchFile& file() const { return *file_; }
  const IoEngine& engine() const { return *io_; }
  // Bytes moved so far and the time spent waiting for them (the step's forward and backward
  // wait for prefetched reads; the update for its reads and the slot reuse).
  uint64_t bytes_read() const { return read_; }
  uint64_t bytes_written() const { return written_; }
  double wait_seconds() const { return wait_s_; }
  // While on, each wait that blocked is kept until take_waits() (--profile's window: io slices
  // in the phases that waited), as OffloadedOptimizer::record_waits.
  void record_waits(bool on) {
    record_waits_ = on;
    if (!on) waits_.clear();
  }
  std::vector<IoWait> take_waits() { return std::exchange(waits_, {}); }

 private:
  IoRequest request(IoRequest::Op op, size_t unit, void* buf) const;

  ParamFileLayout layout_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<ScratchFile> file_;
  uint64_t read_ = 0, written_ = 0;
  double wait_s_ = 0;
  bool record_waits_ = false;
  std::vector<IoWait> waits_;
};

// A run's counters of a ParamFile (zeros without one), and their difference over a step.
struct ParamIoStats {
  uint64_t read_bytes = 0, written_bytes = 0;
  double wait_seconds = 0;
  ParamIoStats operator-(const ParamIoStats& o) const {
    return {read_bytes - o.read_bytes, written_bytes - o.written_bytes,
            wait_seconds - o.wait_seconds};
  }
};
inline ParamIoStats param_io_stats(const ParamFile* f) {
  return f ? ParamIoStats{f->bytes_read(), f->bytes_written(), f->wait_seconds()}
           : ParamIoStats{};
}

}  // namespace memfit::offload
