// Gradients reduced per unit into a shard's accumulator (Note [Sharded gradients] in
// docs/notes/zero.md).
#include "memfit/dist/zero/unit_grads.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "memfit/core/error.h"
#include "memfit/dist/grad_sync.h"
#include "memfit/dist/shard_collectives.h"
#include "memfit/kernels/cpu/fill.h"
#include "memfit/model/unit_map.h"
#include "memfit/state/shard.h"

namespace memfit {

namespace {

// Buffers start 64-byte aligned: every size rounded to 16 floats.
constexpr int64_t kGranule = 16;
int64_t granules(int64_t n) { return (n + kGranule - 1) / kGranule * kGranule; }

size_t pool_floats(int64_t n) {
  return n > 0 ? MemoryPool::round_up(static_cast<size_t>(n) * sizeof(float)) : 0;
}

// The sizes every rank derives alike from the layout. The edge units (the embeddings, the
// tail, a tied last stage's copy of the table: whichever the layout holds, model/unit_map.h)
// each at `edge_at` in the edge buffer, in unit order; with shared edges the embeddings and the
// tail both at 0.
struct Sizes {
  UnitMap map;
  std::vector<int64_t> edge_at;  // per unit: its place in the edge buffer (-1: a block)
  int64_t edge_elements = 0, slot_elements = 0, largest_unit = 0;
};

Sizes sizes(const ParamLayout& layout) {
  Sizes s;
  s.map = unit_map(layout);
  const std::vector<ElementRange>& units = s.map.units;
  s.edge_at.assign(units.size(), -1);
  const bool shared = UnitGrads::shared_edges(layout);
  for (size_t u = 0; u < units.size(); ++u) {
    s.largest_unit = std::max(s.largest_unit, units[u].size());
    if (!s.map.edge(u)) {
      s.slot_elements = std::max(s.slot_elements, granules(units[u].size()));
    } else if (shared) {
      s.edge_at[u] = 0;
      s.edge_elements = std::max(s.edge_elements, granules(units[u].size()));
    } else {
      s.edge_at[u] = s.edge_elements;
      s.edge_elements += granules(units[u].size());
    }
  }
  return s;
}

// Floats of one receive buffer on `rank`: world pieces of its largest part of a bucket, and at
// least world (the scalar sums go through it).
int64_t receive_floats(const Sizes& s, int64_t n, size_t bucket_bytes,
                       std::span<const ElementRange> shards, int rank, bool whole) {
  const int world = static_cast<int>(shards.size());
  const int64_t full = dist::bucket_floats(n, bucket_bytes);
  int64_t piece = 0;
  if (whole) {
    piece = dist::even_counts(std::min(full, s.largest_unit), world)[static_cast<size_t>(rank)];
  } else {
    // gradient_buckets cuts `per` from each shard's part of a unit: the largest is per, or the
    // largest part when every part is smaller.
    const int64_t per = std::max<int64_t>(1, full / std::max(world, 1));
    for (const ElementRange& u : s.map.units)
      piece = std::max(piece, std::min(per, shards[static_cast<size_t>(rank)].intersect(u).size()));
  }
  return std::max<int64_t>(int64_t{world} * piece, world);
}

// Bytes of one receive buffer: the pieces in the exchange's type, and at least the W floats a
// scalar sum receives.
size_t receive_slot_bytes(int64_t elements, DType dtype, int world) {
  return std::max(static_cast<size_t>(elements) * dtype_size(dtype),
                  static_cast<size_t>(world) * sizeof(float));
}

// A bucket's f32 gradients rounded to bf16 (nearest even) into the first half of their own
// bytes, front to back: element i's bf16 goes where elements i/2's f32 was, already read.
// Sequential, since a parallel pass would overwrite what another thread has yet to read.
uint16_t* pack_bf16(float* x, int64_t n) {
  uint16_t* out = reinterpret_cast<uint16_t*>(x);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = bf16_from_f32(v);
  }
  return out;
}

}  // namespace

ElementRange UnitGrads::sums_range(const ParamLayout& layout, std::span<const ElementRange> shards,
                                   int rank, bool whole) {
  return whole ? ElementRange{0, layout.total()} : shards[static_cast<size_t>(rank)];
}

size_t UnitGrads::grads_bytes(const ParamLayout& layout, std::span<const ElementRange> shards,
                              int rank, bool whole, DType dtype) {
  return MemoryPool::round_up(
      std::max<size_t>(1, static_cast<size_t>(sums_range(layout, shards, rank, whole).size()) *
                              dtype_size(dtype)));
}

bool UnitGrads::shared_edges(const ParamLayout& layout) {
  // (A pipeline stage holds both edges only when it is the whole model.)
  return unit_map(layout).embeddings >= 0 &&
         std::any_of(layout.params().begin(), layout.params().end(),
                     [](const ParamInfo& p) { return p.role == ParamRole::lm_head; });
}

int64_t UnitGrads::edge_floats(const ParamLayout& layout) { return sizes(layout).edge_elements; }
int64_t UnitGrads::slot_floats(const ParamLayout& layout) { return sizes(layout).slot_elements; }

size_t UnitGrads::comm_bytes(const ParamLayout& layout, size_t bucket_bytes,
                             std::span<const ElementRange> shards, int rank, bool whole,
                             DType dtype) {
  const Sizes s = sizes(layout);
  const size_t slot = receive_slot_bytes(
      receive_floats(s, layout.total(), bucket_bytes, shards, rank, whole), dtype,
      static_cast<int>(shards.size()));
  return pool_floats(s.edge_elements) + pool_floats(s.slot_elements * kSlots) +
         MemoryPool::round_up(kInFlight * slot);
}

UnitGrads::UnitGrads(MemoryPool& pool, const ParamLayout& layout, GradSharding sharding,
                     Tensor sums)
    : layout_(layout), s_(std::move(sharding)) {
  MEMFIT_CHECK(s_.comm != nullptr && static_cast<int>(s_.shards.size()) == s_.comm->size() &&
                   !s_.shards.empty() && s_.shards.front().begin == 0 &&
                   s_.shards.back().end == layout.total(),
               "zero", "per-unit gradients need one shard per rank tiling the layout ({} shards "
               "for {} ranks)", s_.shards.size(), s_.comm ? s_.comm->size() : 0);
  const int rank = s_.comm->rank();
  const Sizes s = sizes(layout);
  map_ = s.map;
  units_ = s.map.units;
  edge_at_ = s.edge_at;
  shared_edges_ = shared_edges(layout);
  slot_elements_ = s.slot_elements;
  range_ = sums_range(layout, s_.shards, rank, s_.whole);
  MEMFIT_CHECK(s_.dtype == DType::f32 || s_.dtype == DType::bf16, "zero",
               "gradients are kept in f32 or bf16, not {}", dtype_name(s_.dtype));
  MEMFIT_CHECK(!s_.steps || (!s_.whole && s_.dtype == DType::f32 && !sums.defined()), "zero",
               "--update-in-backward steps the reduce-scattered f32 sums in place: stages 2-3, "
               "f32 gradients, no accumulator");
  if (s_.steps) {
    // No accumulator: each unit's sums are stepped from its buffer (done()).
  } else if (sums.defined()) {
    MEMFIT_CHECK(sums.dtype() == s_.dtype && sums.numel() == range_.size(), "zero",
                 "a gradient accumulator of {} elements for a range of {}", sums.numel(),
                 range_.size());
    sums_ = sums;
  } else {
    sums_ = Tensor::empty(pool, {std::max<int64_t>(1, range_.size())}, s_.dtype,
                          Category::grads, "grads");
    if (range_.empty()) sums_ = sums_.view(0, {0});
  }
  // (A stage between the first and the last has no edge unit.)
  if (s.edge_elements > 0)
    edges_ = Tensor::empty(pool, {s.edge_elements}, DType::f32, Category::comm,
                           "comm.grads.edges");
  if (slot_elements_ > 0)
    ring_ = Tensor::empty(pool, {slot_elements_ * kSlots}, DType::f32, Category::comm,
                          "comm.grads.ring");
  receive_floats_ = receive_floats(s, layout.total(), s_.bucket_bytes, s_.shards, rank, s_.whole);
  receive_slot_bytes_ = receive_slot_bytes(receive_floats_, s_.dtype, s_.comm->size());
  receive_ = pool.allocate(MemoryPool::round_up(kInFlight * receive_slot_bytes_), Category::comm,
                           "comm.grad_ring");
  // Every view undefined until a unit's buffer is bound, but every block's there to index: a
  // pipeline stage between the first and the last binds no edge unit here, and its forwards
  // read the views' blocks before its first backward binds one (UBSan: indexing an empty vector).
  views_ = layout_.views(Tensor{});
  for (size_t u = 0; u < units_.size(); ++u)
    if (edge_at_[u] >= 0)
      layout_.bind(views_, edges_.view(edge_at_[u], {units_[u].size()}), units_[u]);
  slot_last_.assign(kSlots, -1);
}

UnitGrads::~UnitGrads() {
  // Requests still in flight (a backward that threw) wait as they are destroyed.
  in_flight_.clear();
}

void UnitGrads::zero() {
  MEMFIT_CHECK(in_flight_.empty(), "zero", "a new step while {} gradient buckets are in flight",
               in_flight_.size());
  first_ = true;
}

void UnitGrads::begin_micro_batch() {
  while (!in_flight_.empty()) wait_oldest();
  if (s_.steps) s_.steps->begin_micro_batch();
  if (edges_.defined()) kernels::zero(edges_);
  next_slot_ = 0;
  tail_last_ = -1;
}

void UnitGrads::enter_backward(int layer) {
  for (auto& f : in_flight_) f.request->test();  // progress: OpenMPI moves requests in MPI calls
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % kSlots;
  // The slot's last exchange read it: wait for it (every rank waits at the same point).
  while (completed_ <= slot_last_[static_cast<size_t>(slot)]) wait_oldest();
  Tensor buffer = ring_.view(slot * slot_elements_, {slot_elements_});
  kernels::zero(buffer);
  const ElementRange unit = units_[map_.block_unit(layer)];
  layout_.bind(views_, buffer.view(0, {unit.size()}), unit);
}

void UnitGrads::enter_embedding_backward() {
  if (!shared_edges_) return;
  // The tail's buckets read the buffer (and the f32 exchange writes its sums into it): every
  // rank waits for them at the same point, as enter_backward does for a slot.
  while (completed_ <= tail_last_) wait_oldest();
  const size_t e = static_cast<size_t>(map_.embeddings);
  Tensor embeddings = edges_.view(edge_at_[e], {units_[e].size()});
  kernels::zero(embeddings);
}

void UnitGrads::done(int part) {
  // The part's units: -1 the embeddings (where the layout holds them: a pipeline stage after
  // the first reports -1 at the end of its backward too), a block of the layout, or else the
  // tail (the step reports it as n_layer), with a tied last stage's copy of the table, whose
  // gradient the forward's LM head wrote.
  std::vector<size_t> parts;
  if (part < 0) {
    if (map_.embeddings >= 0) parts.push_back(static_cast<size_t>(map_.embeddings));
  } else if (map_.has_block(part)) {
    parts.push_back(map_.block_unit(part));
  } else {
    MEMFIT_CHECK(map_.tail >= 0, "zero", "the backward finished part {}, which this layout "
                 "does not hold (blocks {} to {}, no tail)", part, map_.first_layer,
                 map_.first_layer + map_.blocks - 1);
    parts.push_back(static_cast<size_t>(map_.tail));
    if (map_.copy >= 0) parts.push_back(static_cast<size_t>(map_.copy));
  }
  for (const size_t u : parts) {
    // The unit's buffer: `held` from element `at` (the edges' or its ring slot's).
    Tensor* held = &edges_;
    int64_t at = edge_at_[u];
    const bool block = !map_.edge(u);
    if (block) {
      // The block's views point into its slot (enter_backward).
      held = &ring_;
      at = ((next_slot_ + kSlots - 1) % kSlots) * slot_elements_;
    }
    reduce(units_[u], held->data<float>() + at);
    if (static_cast<int>(u) == map_.tail) tail_last_ = started_ - 1;
    if (block)
      slot_last_[static_cast<size_t>((next_slot_ + kSlots - 1) % kSlots)] = started_ - 1;
    if (s_.steps) {
      // --update-in-backward: this rank's part of the unit's sums, in place in its buffer once
      // every bucket of it is reduced, stepped now (Note [Update in backward]).
      while (!in_flight_.empty()) wait_oldest();
      const ElementRange mine = range_.intersect(units_[u]);
      s_.steps->unit_done(
          u, held->view(at + (mine.empty() ? 0 : mine.begin - units_[u].begin), {mine.size()}));
    }
  }
  if (part < 0) {
    // The micro-batch's sums are all in: later micro-batches add to them.
    while (!in_flight_.empty()) wait_oldest();
    first_ = false;
    if (s_.steps) s_.steps->end_backward();
  }
}

void UnitGrads::reduce(ElementRange unit, float* buffer) {
  // The stage-2 exchange's cut (each bucket inside one shard), or the all-reduce's.
  const std::span<const ElementRange> owners =
      s_.whole ? std::span<const ElementRange>() : std::span<const ElementRange>(s_.shards);
  const bool bf16 = s_.dtype == DType::bf16;
  const int64_t esize = static_cast<int64_t>(dtype_size(s_.dtype));
  const bool several = s_.comm->size() > 1;
  for (const ElementRange& b : dist::gradient_buckets(unit, layout_.total(), s_.bucket_bytes,
                                                      s_.comm->size(), owners)) {
    if (static_cast<int>(in_flight_.size()) == kInFlight) wait_oldest();
    void* receive = static_cast<char*>(receive_.data()) +
                    static_cast<size_t>(started_ % kInFlight) * receive_slot_bytes_;
    float* in = buffer + (b.begin - unit.begin);
    // (None with --update-in-backward: the sums stay in the unit's buffer.)
    char* sums = s_.steps ? nullptr : static_cast<char*>(sums_.raw_data());
    InFlight f;
    if (bf16) {
      // Rounded to bf16 in place; the sums are written into this rank's part of the packed
      // bucket once the exchange is done (Note [Gradients in bf16]).
      uint16_t* packed = pack_bf16(in, b.size());
      const std::vector<int64_t> counts =
          s_.whole ? dist::even_counts(b.size(), s_.comm->size()) : dist::shard_counts(s_.shards, b);
      int64_t at = 0;  // this rank's part of the bucket
      for (int q = 0; q < s_.comm->rank(); ++q) at += counts[static_cast<size_t>(q)];
      const int64_t mine = counts[static_cast<size_t>(s_.comm->rank())];
      f.request = s_.comm->reduce_scatter_bf16_async(
          {packed, static_cast<size_t>(b.size())}, {packed + at, static_cast<size_t>(mine)},
          counts, {static_cast<uint16_t*>(receive), static_cast<size_t>(receive_floats_)});
      if (s_.whole) {
        if (several) volume_.all_reduce += b.size() * esize;
        f.from = packed;
        f.into = sums + (b.begin - range_.begin) * esize;
        f.count = b.size();
        f.gather_counts = counts;
      } else {
        if (several) volume_.reduce_scatter += b.size() * esize;
        f.from = packed + at;
        f.into = mine == 0 ? nullptr : sums + (b.begin + at - range_.begin) * esize;
        f.count = mine;
      }
    } else if (s_.whole) {
      volume_.all_reduce += b.size() * 4;
      f.request = s_.comm->all_reduce_async(
          {in, static_cast<size_t>(b.size())},
          {static_cast<float*>(receive), static_cast<size_t>(receive_floats_)});
      f.from = in;
      f.into = sums + (b.begin - range_.begin) * esize;
      f.count = b.size();
    } else {
      // The owner's part of the bucket gets the sums in place, then into the accumulator.
      volume_.reduce_scatter += b.size() * 4;
      const ElementRange mine = range_.intersect(b);
      float* out = buffer + (mine.empty() ? 0 : mine.begin - unit.begin);
      const std::vector<int64_t> counts = dist::shard_counts(s_.shards, b);
      f.request = s_.comm->reduce_scatter_async(
          {in, static_cast<size_t>(b.size())}, {out, static_cast<size_t>(mine.size())}, counts,
          {static_cast<float*>(receive), static_cast<size_t>(receive_floats_)});
      f.from = out;
      f.into = mine.empty() || !sums ? nullptr : sums + (mine.begin - range_.begin) * esize;
      f.count = mine.size();
    }
    in_flight_.push_back(std::move(f));
    ++started_;
  }
}

void UnitGrads::wait_oldest() {
  InFlight& f = in_flight_.front();
  f.request->wait();
  // bf16's all-reduce: every rank's rounded sums gathered in place (started here, where every
  // rank waits, as the f32 all-reduce starts its gather in wait()).
  if (!f.gather_counts.empty()) {
    uint16_t* packed = static_cast<uint16_t*>(const_cast<void*>(f.from));
    int64_t at = 0;
    for (int q = 0; q < s_.comm->rank(); ++q) at += f.gather_counts[static_cast<size_t>(q)];
    s_.comm->all_gather(packed + at, packed, f.gather_counts, sizeof(uint16_t));
  }
  // Fold: the first micro-batch's sums are copied (exactly stage 0's summed slab), later ones
  // added, element by element (bf16: in f32, rounded once).
  if (f.count > 0 && f.into) {
    const size_t esize = dtype_size(s_.dtype);
    if (first_) {
      std::memcpy(f.into, f.from, static_cast<size_t>(f.count) * esize);
    } else if (s_.dtype == DType::bf16) {
      uint16_t* into = static_cast<uint16_t*>(f.into);
      const uint16_t* from = static_cast<const uint16_t*>(f.from);
#pragma omp parallel for schedule(static) if (f.count > (1 << 16))
      for (int64_t i = 0; i < f.count; ++i)
        into[i] = bf16_from_f32(f32_from_bf16(into[i]) + f32_from_bf16(from[i]));
    } else {
      float* into = static_cast<float*>(f.into);
      const float* from = static_cast<const float*>(f.from);
#pragma omp parallel for schedule(static) if (f.count > (1 << 16))
      for (int64_t i = 0; i < f.count; ++i) into[i] += from[i];
    }
  }
  in_flight_.pop_front();
  ++completed_;
}
float UnitGrads::sum(float x) {
  MEMFIT_CHECK(in_flight_.empty(), "zero", "a scalar sum while {} buckets are in flight",
               in_flight_.size());
  s_.comm->all_reduce({&x, 1},
                      {static_cast<float*>(receive_.data()), static_cast<size_t>(receive_floats_)});
  return x;
}

dist::CommVolume UnitGrads::take_volume() { return std::exchange(volume_, dist::CommVolume{}); }

}  // namespace memfit
