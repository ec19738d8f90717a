// ZeRO stage 3's working weights (Note [ZeRO stage 3] in docs/notes/zero.md): each rank keeps
// its shard of the parameter slab (Category::params) and gathers the units the step reads
// (unit_ranges in model/param_layout.h: the embeddings, each block, the tail) into buffers of
// Category::comm that are allocated once, so the plan is exact whatever the timing:
//   - persistent units, gathered once each time the shard changes (refresh()) and kept whole:
//     the embeddings and the tail always (their buffers would live for the whole run anyway,
//     and GPT-2's tied head reads the embeddings twice a forward), and every block smaller
//     than --persist-threshold elements;
//   - the other blocks, gathered into a ring of prefetch_depth + 1 slots of the largest block,
//     in the order the step plan's phases need them (gather_events), each started
//     prefetch_depth events ahead and waited for when its phase is entered.
// The engine and the planner read the same arithmetic (comm_bytes, step_gather_bytes).
// A pipeline stage's layout has its own units (model/unit_map.h): the edge units it holds are
// persistent, its blocks gathered as its phases need them; a forward alone (a stage before the
// last sending its output) gathers its blocks too, and the next pass waits for what it
// prefetched (forward_gather_bytes; Note [Pipeline parallel], "ZeRO").
// The second source (--offload-params nvme, Note [NVMe offload], "Working weights on disk"):
// in one process the blocks' working weights live in a file (UnitFile, offload/param_file.h);
// the same events read each block from it into the ring instead of all-gathering it, the
// persistent units are the working weights in RAM (Category::params), and the update writes
// each block back through the ring (update_piece). At stage 3 the file holds the rank's part of
// each block: a gather reads it (through a landing buffer), then all-gathers as above.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/dist/communicator.h"
#include "memfit/memory/pool.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_schedule.h"
#include "memfit/model/weight_source.h"
#include "memfit/core/element_range.h"

namespace memfit {

// How stage 3 shards the working weights.
struct ParamSharding {
  dist::Communicator* comm = nullptr;
  std::vector<ElementRange> shards;  // one per rank, tiling the layout (shard_ranges)
  int prefetch_depth = 1;            // blocks gathered ahead of the one computing (>= 0)
  int64_t persist_threshold = 0;     // blocks of fewer elements are kept whole
};

// The units of `layout` and which are kept whole.
struct GatherUnits {
  std::vector<ElementRange> units;  // unit_ranges(layout)
  int first_block = 1, first_layer = 0;  // the layout's first block: its unit, its index
  std::vector<bool> persistent;     // the embeddings, the tail (and a tied last stage's copy of
                                    // the table), blocks under the threshold
  int64_t persistent_elements = 0;  // their sum: the persistent buffer
  int64_t slot_elements = 0;        // the largest gathered block, rounded up to 32 elements
};
GatherUnits gather_units(const ParamLayout& layout, int64_t persist_threshold);

// The gathers of one micro-batch's step, in order: the unit each gathers. A block's phases
// (forward, recompute, backward) need it; phases that need another block start a new gather,
// phases that need a persistent unit or none do not, so a block needed by two phases with only
// such phases between is gathered once (the top block's forward and backward without
// checkpointing; a recomputed block and its backward). `phase_event`, if given, gets each
// phase's gather (-1: none).
std::vector<int> gather_events(const GatherUnits& units, const std::vector<Phase>& phases,
                               std::vector<int>* phase_event = nullptr);

// Where the units that are not persistent live when they are not gathered from the ranks: a
// file (offload/param_file.h implements it). Unit u is unit_ranges(layout)[u]; `dst`/`src` are
// aligned ring slots of at least the unit's bytes rounded up to 4 KiB.
class UnitFile {
 public:
  virtual ~UnitFile() = default;
  virtual uint64_t read(size_t unit, void* dst) = 0;  // a ticket
  virtual uint64_t write(size_t unit, const void* src) = 0;
  virtual void wait(uint64_t ticket) = 0;
  // Every block's data is written (the update ended): the header's step.
  virtual void set_step(int64_t step) = 0;
};

// --offload-params: the file and how far ahead the step reads it.
struct ParamOffload {
  UnitFile* file = nullptr;
  int prefetch_depth = 1;          // blocks read ahead of the one computing (>= 0)
  int64_t persist_threshold = 0;   // blocks of fewer elements stay in RAM
};

// The bytes of RAM the file source holds. One process: the persistent units (Category::params)
// and the ring (Category::staging, each slot a multiple of 4 KiB, plus a page to align its
// start). Stage 3 (each rank's shard in its file): the gathered units' buffers as without the
// file (comm_bytes) plus a landing buffer for the rank's part of one block (Category::comm, its
// largest part rounded up to 4 KiB, plus a page), and no working shard in RAM. What the
// constructors allocate.
struct UnitFileRam {
  size_t params = 0, staging = 0, comm = 0;
};

class WeightGather final : public WeightSource {
 public:
  static UnitFileRam file_ram_bytes(const ParamLayout& layout, DType dtype, int prefetch_depth,
                                    int64_t persist_threshold,
                                    std::optional<ElementRange> mine = std::nullopt);

  // The bytes of Category::comm a rank holds for the gathers: the persistent buffer and the
  // ring (each the pool's rounding of its bytes; 0 where empty). What the constructor allocates.
  static size_t comm_bytes(const ParamLayout& layout, DType dtype, int prefetch_depth,
                           int64_t persist_threshold);
  // The bytes the gathers of a training step cover: the persistent units once (after the
  // update) and each micro-batch's gathers.
  static int64_t step_gather_bytes(const ParamLayout& layout, DType dtype,
                                   const std::vector<Phase>& phases, int grad_accum,
                                   int64_t persist_threshold);
  // The bytes a forward alone (a pipeline stage before the last sending its output: Note
  // [Pipeline parallel], "ZeRO") gathers: its blocks' gathers and those its last phases
  // prefetch, up to prefetch_depth past its last block (the next pass waits for them).
  static int64_t forward_gather_bytes(const ParamLayout& layout, DType dtype,
                                      const std::vector<Phase>& phases, int prefetch_depth,
                                      int64_t persist_threshold);
  // The units (of gather_units) that forward gathers, in order: with --offload-params what
  // it reads from the file (the planner's I/O).
  static std::vector<int> forward_gather_units(const ParamLayout& layout,
                                               const std::vector<Phase>& phases,
                                               int prefetch_depth, int64_t persist_threshold);

  // `shard`: this rank's range of the working weights (dtype), its storage kept by the caller.
  // With `file` (--offload-params at stage 3) the shard is in the file instead (`shard` is then
  // undefined and `file_dtype` the working weights' dtype): each gather first reads the rank's part of the unit from it,
  // the persistent units' parts live in the persistent buffer itself, and the update reads and
  // writes the rank's part of each block through a landing buffer.
  WeightGather(MemoryPool& pool, const ParamLayout& layout, const Tensor& shard,
               ParamSharding sharding, UnitFile* file = nullptr,
               DType file_dtype = DType::f32);
  // The file source in one process (--offload-params): the persistent units in RAM, the other
  // blocks read from `file` (kept by the caller) as the step needs them.
  WeightGather(MemoryPool& pool, const ParamLayout& layout, DType dtype, UnitFile& file,
               int prefetch_depth, int64_t persist_threshold);
  // The file source waits for its reads and writes first: none may outlive the ring.
  ~WeightGather() override;
  bool from_file() const override { return file_ != nullptr; }

  // File source: the working copy from `fill(from, to, dst)` (f32 values of layout elements
  // [from, to), as Transformer::set_weights takes them), through `piece` (f32, at most
  // largest_part() elements), rounded as refresh_working rounds (to nearest even): the
  // persistent units in RAM, each block through a ring slot into the file (stage 3: the rank's
  // parts alone, the blocks' through the landing buffer). And the reverse, to `sink`: the
  // rank's range (every element in one process) in order as bytes of the working dtype.
  void store_from(const std::function<void(int64_t, int64_t, float*)>& fill,
                  Tensor& piece) override;
  void read_mine(const std::function<void(const char*, size_t)>& sink);
  // File source in one process: layout elements [from, to) of the working weights inside
  // `want`, unit by unit in order, as bytes of the working dtype: a persistent unit's from RAM,
  // a block's read into a ring slot, two in turn so the next read is in flight (one with
  // --prefetch-depth 0). What a streamed save reads (io/checkpoint/streamed_weights.h).
  void read_range(ElementRange want,
                  const std::function<void(int64_t from, int64_t to, const char* src)>& take);
  // The longest unit part this rank stores (the whole unit in one process).
  int64_t largest_part() const override;
  DType dtype() const { return dtype_; }
  // File source: the update's view of the working weights of `piece` (inside one unit, the
  // pieces of a unit in order, units in order): a persistent unit's in RAM, else the block's
  // place in a ring slot, the block read in first when `read` (an update without master
  // weights reads them). update_piece_done writes a block back once its last piece is done;
  // end_update waits for the writes and stamps the file's step.
  Tensor update_piece(ElementRange piece, bool read);
  void update_piece_done(ElementRange piece);
  void end_update(int64_t step);
  // --update-in-backward: the view of `piece`'s working weights as the backward left them: a
  // persistent unit's in RAM, a block's in the slot its backward just read (the current
  // gather: no second read). stepped_piece_done writes the block back from that slot once its
  // last piece is stepped; the slot's next read waits for that write (enter), and end_update
  // for every write. At stage 3 (the file holds this rank's part of each block) the pieces
  // are the rank's part, and the part goes back through the landing buffer, whose next read
  // waits for the write (gather).
  Tensor stepped_piece(ElementRange piece);
  void stepped_piece_done(ElementRange piece);

  // The views the step reads: persistent units always, a block once its phase is entered.
  const ModelWeights& weights() const override { return weights_; }
  void set_bind_hook(BindHook hook) override {
    bind_hook_ = std::move(hook);
    if (bind_hook_) bind_hook_(weights_);
  }
  // The phases of the step plan the model runs from now on (Transformer::reserve).
  void set_phases(const std::vector<Phase>& phases) override;
  // The step entered phase `phase` of the plan (0: a new micro-batch). Waits for the gather
  // the phase needs, binds its views, and starts the next prefetch_depth gathers.
  void enter(int phase) override;
  // The shard changed (update, load, initialisation): every rank calls it at the same point.
  // Finishes gathers in flight, then gathers the persistent units (blocking).
  void refresh() override;
  // The bytes gathered since the last call.
  int64_t take_gathered_bytes() override { return std::exchange(gathered_, 0); }

 private:
  void drain();
  void bind_persistent();
  std::unique_ptr<dist::Request> gather(size_t u, char* dst);
  char* slot_bytes(int slot) const;
  char* landing() const;
  DType working_dtype() const;
  void pad_landing(int64_t elements);
  bool sharded_file() const { return file_ && s_.comm; }
  Tensor slot_view(int slot, int64_t at, int64_t n) const;
  size_t unit_of(int64_t element) const;

  const ParamLayout& layout_;
  Tensor shard_;
  ParamSharding s_;
  GatherUnits units_;
  size_t elem_ = 0;
  DType dtype_ = DType::f32;  // the working weights' dtype
  ElementRange mine_;
  Tensor persistent_, ring_;
  std::vector<int64_t> persistent_at_;  // each persistent unit's offset in persistent_
  ModelWeights weights_;
  BindHook bind_hook_;  // after every binding (LoRA's adapters)
  // The current plan: each phase's gather, each gather's unit; the micro-batch's requests.
  std::vector<int> phase_event_, event_unit_;
  std::vector<std::unique_ptr<dist::Request>> requests_;
  int started_ = 0, current_ = -1, slots_ = 0;
  int64_t gathered_ = 0;
  // The file source: the file, the ring's first aligned element, and the update's block in
  // flight (its unit and slot) with each slot's write.
  UnitFile* file_ = nullptr;
  int64_t ring_at_ = 0;
  Tensor landing_;  // stage 3 with a file: one block's part of this rank, page-aligned
  size_t landing_at_ = 0;
  uint64_t landing_write_ = 0;
  int update_unit_ = -1, update_slot_ = -1;
  std::vector<uint64_t> slot_write_;
};

}  // namespace memfit
