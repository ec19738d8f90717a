// ZeRO stages 2 and 3's gradients (Note [Sharded gradients] in docs/notes/zero.md): no rank
// holds the whole f32 gradient slab. The backward writes each unit's gradients
// (model/param_layout.h: the embeddings, each block, the tail) into a buffer of its own, as stage
// 3's WeightGather binds the weights, and each unit is reduced over the ranks as soon as its
// backward ends; the sums of this rank's shard are folded into a shard-sized f32 accumulator
// (Category::grads), which the update reads. Every micro-batch is reduced (Σ_m Σ_r where the
// whole slab adds Σ_r Σ_m).
//   - the embeddings and the tail: a buffer each, held for the micro-batch (GPT-2's tied head
//     writes the embedding gradient during the forward's LM head, the untied head is the
//     tail's), zeroed when a training forward starts. With an untied head (shared_edges) the
//     embeddings' gradients are written only by their own backward, the step's last part, when
//     the tail's exchange is long done: one buffer of the larger of the two serves both, the
//     embeddings' view zeroed when their backward starts (once the tail's last bucket is
//     folded); at a 128k vocabulary this saves V x C floats (3.9 GiB at Llama 3 70B);
//   - the blocks: a ring of kSlots block-sized buffers; block l's slot is zeroed when its
//     backward starts (once the slot's last exchange is done) and its buckets started when it
//     ends;
//   - each unit in buckets inside one shard (dist::gradient_buckets, the receive buffer the
//     stage-2 exchange has always had), at most kInFlight in flight through a receive ring.
// With `whole` (stages 0-1 under --sync-every-micro-batch) the buckets are all-reduced and the
// accumulator is the whole layout: the same sums, bit for bit, as stages 2-3 (the bit-identity
// tests with gradient accumulation use it). With dtype bf16 (--grad-dtype bf16, Note [Gradients
// in bf16]) the accumulator is bf16 and the exchange moves bf16: each bucket of a unit's f32
// buffer is rounded to bf16 in place before it is sent, the communicator adds the ranks' values
// in f32 in rank order and rounds once, and later micro-batches add into the accumulator in f32,
// rounded once each. Every buffer is allocated once: the planner reads
// grads_bytes and comm_bytes, so the plan is exact whatever the timing.
// A pipeline stage's layout (--pp, Note [Pipeline parallel], "ZeRO") has its own units
// (model/unit_map.h): its blocks take the ring, and its edge units are whichever it holds (the
// embeddings on the first stage, the tail on the last with a tied model's copy of the table,
// reduced with the tail; none between); its backward reports -1 at its end on every stage.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/dist/comm_volume.h"
#include "memfit/dist/communicator.h"
#include "memfit/memory/pool.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/unit_map.h"
#include "memfit/optim/unit_steps.h"
#include "memfit/core/element_range.h"

namespace memfit {

// How the gradients are reduced per unit.
struct GradSharding {
  dist::Communicator* comm = nullptr;
  std::vector<ElementRange> shards;  // one per rank, tiling the layout (shard_ranges)
  size_t bucket_bytes = 25u << 20;   // --bucket-mb
  // Stages 0-1 reducing every micro-batch: all-reduce, the accumulator the whole layout.
  bool whole = false;
  // The accumulator's and the exchange's type: f32, or bf16 (--grad-dtype bf16).
  DType dtype = DType::f32;
  // --update-in-backward (stages 2-3, f32; Note [Update in backward]): no accumulator; as each
  // unit's reduce-scatter completes, this rank's part of its sums (in place in the unit's
  // buffer) is stepped by these steps (over this rank's shard), kept by the caller.
  UnitSteps* steps = nullptr;
};

class UnitGrads final : public GradStore {
 public:
  static constexpr int kSlots = 2;     // block buffers
  static constexpr int kInFlight = 2;  // buckets in flight (receive buffers)

  // The accumulator's range on `rank`: its shard, or the whole layout.
  static ElementRange sums_range(const ParamLayout& layout, std::span<const ElementRange> shards,
                                 int rank, bool whole);
  // Category::grads a rank holds: the accumulator (at least the pool's smallest block, as an
  // empty shard's).
  static size_t grads_bytes(const ParamLayout& layout, std::span<const ElementRange> shards,
                            int rank, bool whole, DType dtype = DType::f32);
  // Whether the embeddings' and the tail's gradients share one buffer: an untied head (a
  // parameter of ParamRole::lm_head), so nothing writes the embeddings' before their backward.
  static bool shared_edges(const ParamLayout& layout);
  // The floats of the edge units' buffer (the embeddings and the tail) and of one block slot.
  static int64_t edge_floats(const ParamLayout& layout);
  static int64_t slot_floats(const ParamLayout& layout);
  // Category::comm a rank holds: the edge units' buffers, the block ring, the receive ring.
  static size_t comm_bytes(const ParamLayout& layout, size_t bucket_bytes,
                           std::span<const ElementRange> shards, int rank, bool whole,
                           DType dtype = DType::f32);

  // `sums`: the accumulator, if the caller provides it (sums_range's elements); else allocated.
  UnitGrads(MemoryPool& pool, const ParamLayout& layout, GradSharding sharding,
            Tensor sums = Tensor{});
  ~UnitGrads() override;

  // The views the step writes: the edge units always, a block once its backward is entered.
  const ModelWeights& views() const override { return views_; }
  // The summed gradients of sums_range() (times the loss scale): what the update reads.
  Tensor& sums() { return sums_; }
  ElementRange range() const { return range_; }
  Tensor* summed() override { return s_.steps ? nullptr : &sums_; }
  ElementRange sums_range() const override { return range_; }

  // A new step: the next micro-batch's sums are the accumulator's first (copied, not added).
  void zero() override;
  // A training forward starts: the edge units' gradients from zero.
  void begin_micro_batch() override;
  // Block `layer`'s backward starts: its gradients into the next slot, from zero.
  void enter_backward(int layer) override;
  // Shared edges: the tail's exchange finished, the embeddings' gradients from zero.
  void enter_embedding_backward() override;
  // The step's backward finished a part (TransformerStep::backward's `done`): n_layer the tail,
  // l block l, -1 the embeddings, after which every exchange is finished and folded.
  void done(int part) override;
  // The sum over ranks of x (the loss, the stop flag), through the receive ring. Not while
  // buckets are in flight (between micro-batches none are).
  float sum(float x);
  // The gradient bytes reduced since the last call.
  dist::CommVolume take_volume();

 private:
  struct InFlight {
    std::unique_ptr<dist::Request> request;
    const void* from = nullptr;  // the sums, in the unit's buffer (f32, or bf16 packed)
    void* into = nullptr;        // the accumulator
    int64_t count = 0;
    // bf16 whole (an all-reduce): the reduce-scatter's sums all-gathered in wait_oldest, in
    // place over `from` (every rank's part).
    std::vector<int64_t> gather_counts;
  };
  void reduce(ElementRange unit, float* buffer);
  void wait_oldest();

  const ParamLayout& layout_;
  GradSharding s_;
  UnitMap map_;  // which unit is which (a pipeline stage's own units: model/unit_map.h)
  std::vector<ElementRange> units_;
  std::vector<int64_t> edge_at_;  // each edge unit's place in edges_ (-1: a block)
  ElementRange range_;
  Tensor sums_, edges_, ring_;
  Allocation receive_;
  int64_t slot_elements_ = 0, receive_floats_ = 0;
  bool shared_edges_ = false;
  int64_t tail_last_ = -1;  // the tail's last bucket this micro-batch (a sequence number)
  size_t receive_slot_bytes_ = 0;  // one receive buffer (kInFlight of them)
  ModelWeights views_;
  std::deque<InFlight> in_flight_;  // oldest first
  int64_t started_ = 0, completed_ = 0;
  std::vector<int64_t> slot_last_;  // each slot's last bucket (a sequence number; -1: none)
  int next_slot_ = 0;
  bool first_ = true;
  dist::CommVolume volume_;
};

}  // namespace memfit
