// ZeRO stage 3's gathers of the working weights (Note [ZeRO stage 3] in docs/notes/zero.md).
#include "memfit/dist/zero/weight_gather.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/dist/shard_collectives.h"
#include "memfit/model/unit_map.h"
#include "memfit/state/shard.h"

namespace memfit {

namespace {

// The ring's slot size is rounded to 32 elements, so every slot starts 64-byte aligned in
// bf16 as in f32.
constexpr int64_t kSlotGranule = 32;
// The file source reads and writes whole slots with O_DIRECT: each slot a multiple of a 4 KiB
// page, the ring's start aligned to one.
constexpr int64_t kFileAlign = 4096;

int64_t round_to(int64_t n, int64_t granule) { return (n + granule - 1) / granule * granule; }

// A unit's read from the file, as the event machinery waits for a gather.
class FileRead final : public dist::Request {
 public:
  FileRead(UnitFile& f, uint64_t ticket) : f_(f), ticket_(ticket) {}
  bool test() override { return false; }  // the kernel (or the engine's threads) moves it
  void wait() override { f_.wait(ticket_); }

 private:
  UnitFile& f_;
  uint64_t ticket_;
};

// The unit of a phase's block (a pipeline stage's layout holds its own blocks: unit_map).
int block_unit(const GatherUnits& g, const Phase& p) {
  switch (p.kind) {
    case PhaseKind::forward:
    case PhaseKind::recompute:
    case PhaseKind::backward: return g.first_block + (p.layer - g.first_layer);
    default: return -1;  // the embeddings and the tail (persistent), or no weights
  }
}

size_t pool_bytes(int64_t elements, size_t elem) {
  return elements > 0 ? MemoryPool::round_up(static_cast<size_t>(elements) * elem) : 0;
}

}  // namespace

GatherUnits gather_units(const ParamLayout& layout, int64_t persist_threshold) {
  GatherUnits g;
  const UnitMap map = unit_map(layout);
  g.units = map.units;
  g.first_block = map.first_block;
  g.first_layer = map.first_layer;
  const size_t n = g.units.size();
  g.persistent.assign(n, false);
  for (size_t u = 0; u < n; ++u) {
    // The edge units: the embeddings, the tail and a tied last stage's copy of the table,
    // whichever the layout holds (a pipeline stage's first and last units may be blocks).
    g.persistent[u] = map.edge(u) || g.units[u].size() < persist_threshold;
    if (g.persistent[u])
      g.persistent_elements += g.units[u].size();
    else
      g.slot_elements = std::max(g.slot_elements, g.units[u].size());
  }
  g.slot_elements = (g.slot_elements + kSlotGranule - 1) / kSlotGranule * kSlotGranule;
  return g;
}

std::vector<int> gather_events(const GatherUnits& units, const std::vector<Phase>& phases,
                               std::vector<int>* phase_event) {
  std::vector<int> events;
  if (phase_event) phase_event->assign(phases.size(), -1);
  int last = -1;
  for (size_t i = 0; i < phases.size(); ++i) {
    const int u = block_unit(units, phases[i]);
    if (u < 0 || units.persistent[static_cast<size_t>(u)]) continue;
    if (u != last) events.push_back(u);
    last = u;
    if (phase_event) (*phase_event)[i] = static_cast<int>(events.size()) - 1;
  }
  return events;
}

size_t WeightGather::comm_bytes(const ParamLayout& layout, DType dtype, int prefetch_depth,
                                int64_t persist_threshold) {
  const GatherUnits g = gather_units(layout, persist_threshold);
  const size_t elem = dtype_size(dtype);
  return pool_bytes(g.persistent_elements, elem) +
         pool_bytes(g.slot_elements * (prefetch_depth + 1), elem);
}

namespace {

// Stage 3 with a file: the rank's largest part of a block it does not keep whole, in bytes
// rounded up to a page (0 if none).
size_t largest_part_bytes(const GatherUnits& g, ElementRange mine, size_t elem) {
  int64_t most = 0;
  for (size_t u = 0; u < g.units.size(); ++u)
    if (!g.persistent[u]) most = std::max(most, g.units[u].intersect(mine).size());
  return static_cast<size_t>(round_to(most * static_cast<int64_t>(elem), kFileAlign));
}

}  // namespace

UnitFileRam WeightGather::file_ram_bytes(const ParamLayout& layout, DType dtype,
                                         int prefetch_depth, int64_t persist_threshold,
                                         std::optional<ElementRange> mine) {
  const GatherUnits g = gather_units(layout, persist_threshold);
  const size_t elem = dtype_size(dtype);
  UnitFileRam r;
  if (mine) {
    const size_t part = largest_part_bytes(g, *mine, elem);
    r.comm = part > 0 ? MemoryPool::round_up(part + static_cast<size_t>(kFileAlign)) : 0;
    return r;
  }
  r.params = pool_bytes(g.persistent_elements, elem);
  if (g.slot_elements > 0) {
    const int64_t slot = round_to(g.slot_elements, kFileAlign / static_cast<int64_t>(elem));
    r.staging = pool_bytes(slot * (prefetch_depth + 1) + kFileAlign / static_cast<int64_t>(elem),
                           elem);
  }
  return r;
}

int64_t WeightGather::step_gather_bytes(const ParamLayout& layout, DType dtype,
                                        const std::vector<Phase>& phases, int grad_accum,
                                        int64_t persist_threshold) {
  const GatherUnits g = gather_units(layout, persist_threshold);
  int64_t per_micro_batch = 0;
  for (int u : gather_events(g, phases)) per_micro_batch += g.units[static_cast<size_t>(u)].size();
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  return (g.persistent_elements + per_micro_batch * grad_accum) * elem;
}

int64_t WeightGather::forward_gather_bytes(const ParamLayout& layout, DType dtype,
                                           const std::vector<Phase>& phases, int prefetch_depth,
                                           int64_t persist_threshold) {
  const GatherUnits g = gather_units(layout, persist_threshold);
  int64_t elements = 0;
  for (int u : forward_gather_units(layout, phases, prefetch_depth, persist_threshold))
    elements += g.units[static_cast<size_t>(u)].size();
  return elements * static_cast<int64_t>(dtype_size(dtype));
}

std::vector<int> WeightGather::forward_gather_units(const ParamLayout& layout,
                                                    const std::vector<Phase>& phases,
                                                    int prefetch_depth,
                                                    int64_t persist_threshold) {
  const GatherUnits g = gather_units(layout, persist_threshold);
  std::vector<int> phase_event;
  const std::vector<int> events = gather_events(g, phases, &phase_event);
  // enter()'s arithmetic over the phases a forward enters (up to the backward's first).
  const int E = static_cast<int>(events.size());
  int started = 0, current = -1;
  for (size_t i = 0; i < phases.size(); ++i) {
    const PhaseKind k = phases[i].kind;
    if (k != PhaseKind::embedding && k != PhaseKind::forward && k != PhaseKind::final_norm &&
        k != PhaseKind::lm_head)
      break;
    const int e = phase_event[i];
    const bool next = e >= 0 && e != current;
    started = std::max(started, std::min(E, (next ? e : current) + prefetch_depth + 1));
    if (next) current = e;
  }
  return {events.begin(), events.begin() + started};
}

WeightGather::WeightGather(MemoryPool& pool, const ParamLayout& layout, const Tensor& shard,
                           ParamSharding sharding, UnitFile* file, DType file_dtype)
    : layout_(layout), shard_(shard), s_(std::move(sharding)), file_(file) {
  MEMFIT_CHECK(s_.comm != nullptr && static_cast<int>(s_.shards.size()) == s_.comm->size(),
               "zero", "stage 3 needs one shard per rank ({} shards for {} ranks)",
               s_.shards.size(), s_.comm ? s_.comm->size() : 0);
  MEMFIT_CHECK(s_.prefetch_depth >= 0, "zero", "--prefetch-depth must be at least 0, got {}",
               s_.prefetch_depth);
  mine_ = s_.shards[static_cast<size_t>(s_.comm->rank())];
  MEMFIT_CHECK(file_ || shard_.numel() == mine_.size(), "zero",
               "a working-weight shard of {} elements for a range of {}", shard_.numel(),
               mine_.size());
  dtype_ = file_ ? file_dtype : shard_.dtype();
  elem_ = dtype_size(dtype_);
  units_ = gather_units(layout, s_.persist_threshold);
  if (units_.persistent_elements > 0)
    persistent_ = Tensor::empty(pool, {units_.persistent_elements}, dtype_,
                                Category::comm, "comm.params.persistent");
  slots_ = s_.prefetch_depth + 1;
  if (units_.slot_elements > 0)
    ring_ = Tensor::empty(pool, {units_.slot_elements * slots_}, dtype_, Category::comm,
                          "comm.params.ring");
  if (file_) {
    slot_write_.assign(static_cast<size_t>(slots_), 0);
    const size_t part = largest_part_bytes(units_, mine_, elem_);
    if (part > 0) {
      landing_ = Tensor::empty(pool, {static_cast<int64_t>(part) + kFileAlign}, DType::u8,
                               Category::comm, "comm.params.landing");
      const auto addr = reinterpret_cast<uintptr_t>(landing_.raw_data());
      landing_at_ = static_cast<size_t>(round_to(static_cast<int64_t>(addr), kFileAlign)) - addr;
    }
  }
  bind_persistent();
}

std::unique_ptr<dist::Request> WeightGather::gather(size_t u, char* dst) {
  if (file_ && !s_.comm) return std::make_unique<FileRead>(*file_, file_->read(u, dst));
  const ElementRange unit = units_.units[u];
  // Every rank's part of the unit, in rank order: the shards tile the layout, so their
  // intersections with the unit tile it. This rank's part is copied into its place and the
  // gather runs in place (it only moves bytes: Note [Deterministic reduction]).
  const std::vector<int64_t> counts = dist::shard_counts(s_.shards, unit);
  const int64_t before =
      std::accumulate(counts.begin(), counts.begin() + s_.comm->rank(), int64_t{0});
  const ElementRange part = mine_.intersect(unit);
  if (file_) {
    // Stage 3 with the shard on disk: a persistent unit's part is in place already (the
    // update and the loads write it there); a block's is read first, then put in place.
    if (!part.empty() && !units_.persistent[u]) {
      if (landing_write_) file_->wait(std::exchange(landing_write_, 0));
      file_->wait(file_->read(u, landing()));
      std::memcpy(dst + static_cast<size_t>(before) * elem_, landing(),
                  static_cast<size_t>(part.size()) * elem_);
    }
  } else if (!part.empty())
    std::memcpy(dst + static_cast<size_t>(before) * elem_,
                static_cast<const char*>(shard_.raw_data()) +
                    static_cast<size_t>(part.begin - mine_.begin) * elem_,
                static_cast<size_t>(part.size()) * elem_);
  gathered_ += unit.size() * static_cast<int64_t>(elem_);
  return s_.comm->all_gather_async(dst + static_cast<size_t>(before) * elem_, dst, counts,
                                   static_cast<int>(elem_));
}

// The persistent units' views, each at its offset in the persistent buffer.
void WeightGather::bind_persistent() {
  int64_t at = 0;
  persistent_at_.assign(units_.units.size(), -1);
  for (size_t u = 0; u < units_.units.size(); ++u) {
    if (!units_.persistent[u]) continue;
    persistent_at_[u] = at;
    layout_.bind(weights_, persistent_.view(at, {units_.units[u].size()}), units_.units[u]);
    at += units_.units[u].size();
  }
  if (bind_hook_) bind_hook_(weights_);
}

void WeightGather::set_phases(const std::vector<Phase>& phases) {
  drain();
  event_unit_ = gather_events(units_, phases, &phase_event_);
  requests_.clear();
  requests_.resize(event_unit_.size());
}

void WeightGather::drain() {
  // Requests left by a forward that stopped before the backward (evaluation): every rank ran
  // the same phases, so every rank waits for the same gathers here.
  for (auto& r : requests_)
    if (r) {
      r->wait();
      r.reset();
    }
  started_ = 0;
  current_ = -1;
}

void WeightGather::enter(int phase) {
  if (phase == 0) drain();
  for (auto& r : requests_)
    if (r) r->test();  // progress: OpenMPI moves a request only inside MPI calls
  const int e = phase_event_.at(static_cast<size_t>(phase));
  const bool next = e >= 0 && e != current_;  // this phase needs the next gather
  // Start the gathers up to prefetch_depth past the one this phase computes with (the next, or
  // the current one; phases without a block of their own, such as the embedding and the head,
  // prefetch too). Gather g's slot is g % (depth + 1): the slot of gather e + depth is gather
  // e - 1's, whose phases are over.
  const int limit = (next ? e : current_) + s_.prefetch_depth;
  const int events = static_cast<int>(event_unit_.size());
  while (started_ < events && started_ <= limit) {  // (no events: no ring)
    // A slot written back by the update in the backward (stepped_piece_done) is read into
    // once that write is done.
    if (!slot_write_.empty())
      if (uint64_t& w = slot_write_[static_cast<size_t>(started_ % slots_)]; w)
        file_->wait(std::exchange(w, 0));
    requests_[static_cast<size_t>(started_)] =
        gather(static_cast<size_t>(event_unit_[started_]), slot_bytes(started_ % slots_));
    ++started_;
  }
  if (!next) return;
  requests_[static_cast<size_t>(e)]->wait();
  requests_[static_cast<size_t>(e)].reset();
  const ElementRange unit = units_.units[static_cast<size_t>(event_unit_[e])];
  layout_.bind(weights_, slot_view(e % slots_, 0, unit.size()), unit);
  if (bind_hook_) bind_hook_(weights_);
  current_ = e;
}

void WeightGather::refresh() {
  drain();
  if (file_ && !s_.comm) return;  // the persistent units are the working weights themselves
  // (A pipeline stage between the first and the last has no persistent unit: no buffer.)
  if (!persistent_.defined()) return;
  std::vector<std::unique_ptr<dist::Request>> pending;
  char* base = static_cast<char*>(persistent_.raw_data());
  for (size_t u = 0; u < units_.units.size(); ++u)
    if (units_.persistent[u])
      pending.push_back(gather(u, base + static_cast<size_t>(persistent_at_[u]) * elem_));
  for (auto& r : pending) r->wait();
}

WeightGather::WeightGather(MemoryPool& pool, const ParamLayout& layout, DType dtype,
                           UnitFile& file, int prefetch_depth, int64_t persist_threshold)
    : layout_(layout), file_(&file) {
  MEMFIT_CHECK(prefetch_depth >= 0, "offload", "--prefetch-depth must be at least 0, got {}",
               prefetch_depth);
  s_.prefetch_depth = prefetch_depth;
  s_.persist_threshold = persist_threshold;
  dtype_ = dtype;
  elem_ = dtype_size(dtype);
  units_ = gather_units(layout, persist_threshold);
  const int64_t page = kFileAlign / static_cast<int64_t>(elem_);
  units_.slot_elements = round_to(units_.slot_elements, page);
  slots_ = prefetch_depth + 1;
  slot_write_.assign(static_cast<size_t>(slots_), 0);
  // The persistent units are the working weights in RAM (what the slab would have held).
  if (units_.persistent_elements > 0)
    persistent_ = Tensor::empty(pool, {units_.persistent_elements}, dtype, Category::params,
                                "params.persistent");
  if (units_.slot_elements > 0) {
    ring_ = Tensor::empty(pool, {units_.slot_elements * slots_ + page}, dtype, Category::staging,
                          "params.ring");
    const auto addr = reinterpret_cast<uintptr_t>(ring_.raw_data());
    ring_at_ = static_cast<int64_t>((addr + kFileAlign - 1) / kFileAlign * kFileAlign - addr) /
               static_cast<int64_t>(elem_);
  }
  bind_persistent();
}

WeightGather::~WeightGather() {
  if (!file_) return;
  try {
    if (!s_.comm)  // (stage 3's requests are collectives: another rank may be gone)
      for (auto& r : requests_)
        if (r) r->wait();
    for (uint64_t w : slot_write_)
      if (w) file_->wait(w);
    if (landing_write_) file_->wait(landing_write_);
  } catch (const std::exception&) {
    // Unwinding from an I/O error already: the engine drained what was in flight.
  }
}

DType WeightGather::working_dtype() const { return dtype_; }

void WeightGather::pad_landing(int64_t elements) {
  // Past the part's last element up to the page the request rounds to: zeros in the file.
  const size_t bytes = static_cast<size_t>(elements) * elem_;
  std::memset(landing() + bytes, 0, static_cast<size_t>(round_to(static_cast<int64_t>(bytes),
                                                                  kFileAlign)) - bytes);
}

char* WeightGather::landing() const {
  return static_cast<char*>(landing_.raw_data()) + landing_at_;
}

char* WeightGather::slot_bytes(int slot) const {
  return static_cast<char*>(ring_.raw_data()) +
         static_cast<size_t>(ring_at_ + slot * units_.slot_elements) * elem_;
}

Tensor WeightGather::slot_view(int slot, int64_t at, int64_t n) const {
  return ring_.view(ring_at_ + slot * units_.slot_elements + at, {n});
}

size_t WeightGather::unit_of(int64_t element) const {
  size_t u = 0;
  while (u + 1 < units_.units.size() && units_.units[u].end <= element) ++u;
  return u;
}

int64_t WeightGather::largest_part() const {
  int64_t most = 1;
  for (const ElementRange& u : units_.units)
    most = std::max(most, (s_.comm ? mine_.intersect(u) : u).size());
  return most;
}

void WeightGather::store_from(const std::function<void(int64_t, int64_t, float*)>& fill,
                              Tensor& piece) {
  MEMFIT_CHECK(file_ && piece.dtype() == DType::f32 && piece.numel() > 0, "offload",
               "store_from takes an f32 staging piece");
  drain();
  // One process: each block is written from the next ring slot while the next block is drawn
  // into another (the set-up's writes overlap its draw); a slot is reused once its write is
  // done. (Stage 3 goes through its one landing buffer, each write waited for.)
  std::vector<uint64_t> writing(static_cast<size_t>(std::max(slots_, 1)), 0);
  size_t next = 0;
  for (size_t u = 0; u < units_.units.size(); ++u) {
    const ElementRange unit = units_.units[u];
    const ElementRange part = s_.comm ? mine_.intersect(unit) : unit;
    if (part.empty()) continue;
    const bool block = !units_.persistent[u];
    // Where the part's first element goes: its place in the persistent buffer, or the start
    // of a ring slot (one process: the part is the block) or of the landing buffer (stage 3).
    char* dst;
    uint64_t* ticket = nullptr;
    if (!block) {
      dst = static_cast<char*>(persistent_.raw_data()) +
            static_cast<size_t>(persistent_at_[u] + part.begin - unit.begin) * elem_;
    } else if (sharded_file()) {
      if (landing_write_) file_->wait(std::exchange(landing_write_, 0));
      dst = landing();
    } else {
      ticket = &writing[next];
      if (*ticket) file_->wait(std::exchange(*ticket, 0));
      dst = slot_bytes(static_cast<int>(next));
      next = (next + 1) % writing.size();
    }
    for (int64_t a = part.begin; a < part.end; a += piece.numel()) {
      const int64_t b = std::min(part.end, a + piece.numel());
      fill(a, b, piece.data<float>());
      kernels::convert_n_team(DType::f32, dtype_,
                              dst + static_cast<size_t>(a - part.begin) * elem_,
                              piece.data<float>(), b - a);
    }
    if (!block) continue;
    // Past the part's last element up to the request's page: zeros in the file.
    const size_t bytes = static_cast<size_t>(part.size()) * elem_;
    std::memset(dst + bytes, 0,
                static_cast<size_t>(round_to(static_cast<int64_t>(bytes), kFileAlign)) - bytes);
    if (ticket)
      *ticket = file_->write(u, dst);
    else
      file_->wait(file_->write(u, dst));
  }
  for (uint64_t t : writing)
    if (t) file_->wait(t);
}

void WeightGather::read_mine(const std::function<void(const char*, size_t)>& sink) {
  MEMFIT_CHECK(file_, "offload", "read_mine without a file source");
  drain();
  for (size_t u = 0; u < units_.units.size(); ++u) {
    const ElementRange unit = units_.units[u];
    const ElementRange part = s_.comm ? mine_.intersect(unit) : unit;
    if (part.empty()) continue;
    const size_t bytes = static_cast<size_t>(part.size()) * elem_;
    if (units_.persistent[u]) {
      sink(static_cast<const char*>(persistent_.raw_data()) +
               static_cast<size_t>(persistent_at_[u] + part.begin - unit.begin) * elem_,
           bytes);
      continue;
    }
    char* buf = sharded_file() ? landing() : slot_bytes(0);
    if (landing_write_) file_->wait(std::exchange(landing_write_, 0));
    file_->wait(file_->read(u, buf));
    sink(buf, bytes);
  }
}

void WeightGather::read_range(
    ElementRange want, const std::function<void(int64_t, int64_t, const char*)>& take) {
  MEMFIT_CHECK(file_ && !s_.comm, "offload",
               "read_range reads a file source's working weights in one process");
  drain();
  // The blocks to read, in order; block k goes to slot k mod 2 (with one slot, --prefetch-depth
  // 0, to slot 0 after the last is handed over), block k + 1's read in flight while `take` has
  // block k.
  std::vector<size_t> blocks;
  for (size_t u = 0; u < units_.units.size(); ++u)
    if (!units_.persistent[u] && !units_.units[u].intersect(want).empty()) blocks.push_back(u);
  const int slots = std::min(slots_, 2);
  std::vector<uint64_t> reads(static_cast<size_t>(slots), 0);
  auto issue = [&](size_t k) {
    const int s = static_cast<int>(k % static_cast<size_t>(slots));
    if (uint64_t& w = slot_write_[static_cast<size_t>(s)]; w) file_->wait(std::exchange(w, 0));
    reads[static_cast<size_t>(s)] = file_->read(blocks[k], slot_bytes(s));
  };
  size_t k = 0;  // the next block to hand over
  try {
    if (!blocks.empty()) issue(0);
    for (size_t u = 0; u < units_.units.size(); ++u) {
      const ElementRange unit = units_.units[u];
      const ElementRange part = unit.intersect(want);
      if (part.empty()) continue;
      const size_t skip = static_cast<size_t>(part.begin - unit.begin) * elem_;
      if (units_.persistent[u]) {
        take(part.begin, part.end,
             static_cast<const char*>(persistent_.raw_data()) +
                 static_cast<size_t>(persistent_at_[u]) * elem_ + skip);
        continue;
      }
      const int s = static_cast<int>(k % static_cast<size_t>(slots));
      file_->wait(std::exchange(reads[static_cast<size_t>(s)], 0));
      if (slots > 1 && k + 1 < blocks.size()) issue(k + 1);
      take(part.begin, part.end, slot_bytes(s) + skip);
      if (slots == 1 && k + 1 < blocks.size()) issue(k + 1);
      ++k;
    }
  } catch (...) {
    // No read may land in the ring behind an unwinding caller.
    for (uint64_t r : reads) {
      if (r == 0) continue;
      try {
        file_->wait(r);
      } catch (const std::exception&) {
        // What is unwinding already reports the failure.
      }
    }
    throw;
  }
}

Tensor WeightGather::update_piece(ElementRange piece, bool read) {
  MEMFIT_CHECK(file_, "offload", "update_piece without a file source");
  const size_t u = unit_of(piece.begin);
  const ElementRange unit = units_.units[u];
  MEMFIT_CHECK(unit.contains(piece), "offload", "piece [{}, {}) crosses a unit", piece.begin,
               piece.end);
  if (units_.persistent[u])
    return persistent_.view(persistent_at_[u] + piece.begin - unit.begin, {piece.size()});
  if (sharded_file()) {
    // Stage 3: the rank's part of the block in the landing buffer, written back at its end.
    const ElementRange part = mine_.intersect(unit);
    if (static_cast<int>(u) != update_unit_) {
      if (update_unit_ < 0) drain();
      update_unit_ = static_cast<int>(u);
      if (landing_write_) file_->wait(std::exchange(landing_write_, 0));
      if (read) file_->wait(file_->read(u, landing()));
    }
    return landing_.view_bytes(landing_at_ + static_cast<size_t>(piece.begin - part.begin) * elem_,
                               {piece.size()}, working_dtype());
  }
  if (static_cast<int>(u) != update_unit_) {
    if (update_unit_ < 0) drain();  // the update's first block: no read into the ring in flight
    // A new block: the next slot, once its last write is done (a double buffer with depth 1).
    update_unit_ = static_cast<int>(u);
    update_slot_ = (update_slot_ + 1) % slots_;
    uint64_t& w = slot_write_[static_cast<size_t>(update_slot_)];
    if (w) file_->wait(std::exchange(w, 0));
    if (read) file_->wait(file_->read(u, slot_bytes(update_slot_)));
  }
  return slot_view(update_slot_, piece.begin - unit.begin, piece.size());
}

void WeightGather::update_piece_done(ElementRange piece) {
  if (update_unit_ < 0) return;
  const ElementRange unit = units_.units[static_cast<size_t>(update_unit_)];
  if (sharded_file()) {
    const ElementRange part = mine_.intersect(unit);
    if (piece.end != part.end || !part.contains(piece)) return;
    pad_landing(part.size());
    landing_write_ = file_->write(static_cast<size_t>(update_unit_), landing());
    update_unit_ = -1;
    return;
  }
  if (piece.end != unit.end || !unit.contains(piece)) return;
  // Past the block's last element the slot holds whatever came before: the file gets zeros.
  char* slot = slot_bytes(update_slot_);
  std::memset(slot + unit.size() * elem_, 0,
              static_cast<size_t>(units_.slot_elements - unit.size()) * elem_);
  slot_write_[static_cast<size_t>(update_slot_)] =
      file_->write(static_cast<size_t>(update_unit_), slot);
  update_unit_ = -1;
}

Tensor WeightGather::stepped_piece(ElementRange piece) {
  MEMFIT_CHECK(file_, "offload", "stepped_piece without a file source");
  const size_t u = unit_of(piece.begin);
  const ElementRange unit = units_.units[u];
  MEMFIT_CHECK(unit.contains(piece), "offload", "piece [{}, {}) crosses a unit", piece.begin,
               piece.end);
  if (units_.persistent[u])
    return persistent_.view(persistent_at_[u] + piece.begin - unit.begin, {piece.size()});
  // The block's backward just ran on the current gather's slot: its weights are there (at
  // stage 3 the whole block gathered, this rank's part among them).
  MEMFIT_CHECK((!sharded_file() || mine_.contains(piece)) && current_ >= 0 && event_unit_.at(static_cast<size_t>(current_)) ==
                                    static_cast<int>(u),
               "offload",
               "stepped_piece: block unit {} is stepped, but the step's current block is unit {}",
               u, current_ >= 0 ? event_unit_[static_cast<size_t>(current_)] : -1);
  return slot_view(current_ % slots_, piece.begin - unit.begin, piece.size());
}

void WeightGather::stepped_piece_done(ElementRange piece) {
  const size_t u = unit_of(piece.begin);
  const ElementRange unit = units_.units[u];
  if (units_.persistent[u]) return;
  const int slot = current_ % slots_;
  if (sharded_file()) {
    // Stage 3: this rank's part of the block, once its last piece is stepped, from the slot
    // into the landing buffer (page-aligned, as the file asks) and written; the next gather's
    // read of the file waits for the write (gather).
    const ElementRange part = mine_.intersect(unit);
    if (piece.end != part.end) return;
    if (landing_write_) file_->wait(std::exchange(landing_write_, 0));
    std::memcpy(landing(),
                slot_bytes(slot) + static_cast<size_t>(part.begin - unit.begin) * elem_,
                static_cast<size_t>(part.size()) * elem_);
    pad_landing(part.size());
    landing_write_ = file_->write(u, landing());
    return;
  }
  if (piece.end != unit.end) return;
  // Past the block's last element the slot holds whatever came before: the file gets zeros.
  char* bytes = slot_bytes(slot);
  std::memset(bytes + unit.size() * elem_, 0,
              static_cast<size_t>(units_.slot_elements - unit.size()) * elem_);
  uint64_t& w = slot_write_[static_cast<size_t>(slot)];
  if (w) file_->wait(std::exchange(w, 0));
  w = file_->write(u, bytes);
}

void WeightGather::end_update(int64_t step) {
  for (uint64_t& w : slot_write_)
    if (w) file_->wait(std::exchange(w, 0));
  if (landing_write_) file_->wait(std::exchange(landing_write_, 0));
  update_unit_ = -1;
  update_slot_ = -1;
  file_->set_step(step);
}

}  // namespace memfit
