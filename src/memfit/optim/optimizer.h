// The optimizer interface, and the one loop every optimizer runs. An optimizer updates a range
// of the parameter layout (the whole layout, a ZeRO shard, one block streamed from disk) from
// the gradients of the same range. Its state is a few tensors, each laid out over the whole
// layout (per element, per 256-value block, per Adam-mini block, ...); an optimizer over a range
// holds exactly the slice of each that its range maps to (state_extents), either allocated from
// the pool (Category::optimizer) or bound by the caller (a staging buffer read from disk). The
// loop walks the range's pieces (the parts of parameters inside it) and hands each to the
// optimizer's update, so a range's result is, element for element, the whole layout's.
// See Note [Model state] (docs/notes/model-state.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optim_config.h"
#include "memfit/core/element_range.h"

namespace memfit {

// One state tensor: its name in checkpoints ("m", "v.codes"), element type and elements.
struct StateSpec {
  std::string name;
  DType dtype;
  int64_t numel;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string name() const = 0;
  // Whether step() takes bf16 weights of record (pure bf16 training, no master copy).
  virtual bool updates_bf16_weights() const { return false; }
  const ParamLayout& layout() const { return layout_; }
  // The elements this optimizer updates.
  const ElementRange& range() const { return range_; }

  // One update. `params` and `grads` cover range() exactly (element 0 is range().begin);
  // grad_scale multiplies every gradient before use (1/accumulation, clipping). `grads` is f32,
  // or bf16 (--grad-dtype bf16) with a widening buffer set (set_grad_widen): each piece is then
  // updated in chunks cut where the state allows (grad_widen_chunks), each chunk's gradients
  // widened exactly into the buffer first; the result is the f32 update of the widened values,
  // bit for bit, since an update over a sub-range is the whole one's on its elements.
  void step(Tensor& params, const Tensor& grads, float lr, float grad_scale);
  // The same on FP32 master weights, and `working` (bf16 or f16, the copy forward and backward
  // read) = the updated master rounded to nearest even, piece by piece while it is in cache.
  // Bit-identical to step() followed by a conversion; AdamW does both in one pass.
  void step_master(Tensor& master, Tensor& working, const Tensor& grads, float lr,
                   float grad_scale);

  // The state tensors of range() by name, for checkpoints; loading writes into these same
  // tensors. A tensor whose slice is empty (a range with none of that state) is left out.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // The state tensors of range(), in state() order, empty ones included: what bind_state takes.
  const std::vector<StateSpec>& state_specs() const { return specs_; }
  // The state tensors of the whole layout (the ones range()'s are slices of).
  const std::vector<StateSpec>& whole_state_specs() const { return whole_; }
  // Where the state of `r` (a sub-range of range(), cut where next_cut allows) lies in each
  // whole-layout state tensor, in that tensor's elements: one range per state tensor. The
  // extents of adjacent ranges tile each tensor, so a shard's state is saved as slices and
  // resharded on load, and an offload file laid out as the whole tensor holds a block's state
  // in one extent.
  std::vector<ElementRange> state_extents(const ElementRange& r) const;
  // Points the state at caller-owned tensors, one per state_specs() entry with its dtype and
  // numel (undefined where numel is 0). For an optimizer made without a pool.
  void bind_state(std::vector<Tensor> tensors);
  // Bytes of state for range() as the pool counts them (each tensor rounded to 64 bytes),
  // allocated or not, plus scratch_bytes(): what the planner predicts.
  size_t state_bytes() const;

  // f32 elements of scratch the update needs beside its state (APOLLO's projected gradient and
  // projection), 0 for most: the most any parameter of the whole layout needs, so the same for
  // every range. An optimizer made with a pool allocates it there (Category::optimizer, counted
  // in state_bytes); one made without is given it by set_scratch (an offloaded optimizer's
  // pieces share one). Never saved: its contents do not outlive one parameter's update.
  virtual int64_t scratch_elements() const { return 0; }
  // FLOPs of matrix products one step() over range() runs beyond its streaming passes
  // (APOLLO's projections, 2 r m n a matrix); 0 for the element-wise optimizers. The planner's
  // step-time model prices them at the f32 GEMM rate.
  virtual double update_flops() const { return 0; }
  size_t scratch_bytes() const;
  void set_scratch(Tensor buffer);
  // The scratch this optimizer allocated or was given (undefined if neither): what optimizers
  // over its sub-ranges share (set_scratch; --update-in-backward's parts, optim/unit_steps.h).
  const Tensor& scratch_buffer() const { return scratch_; }

  // The first cut at or after element x (<= layout total) that this optimizer's state allows:
  // inside a parameter, a multiple of 16 elements for element-wise state; an optimizer whose
  // state has blocks moves it to its block boundaries. In padding between parameters, the next
  // parameter's start. shard_ranges cuts here.
  virtual int64_t next_cut(int64_t x) const;

  // The f32 buffer bf16 gradients are widened into, a chunk at a time (at least
  // grad_widen_elements(*this) elements; the caller's, from the pool).
  void set_grad_widen(Tensor buffer) { widen_ = std::move(buffer); }

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }

 protected:
  // Over `range`, the whole layout when it is absent.
  Optimizer(const OptimConfig& config, const ParamLayout& layout,
            std::optional<ElementRange> range);

  // A part of one parameter inside range(): its elements [begin, end) of the slab.
  struct Piece {
    const ParamInfo& param;
    size_t index;  // into layout().params()
    int64_t begin, end;
    int64_t numel() const { return end - begin; }
    // This piece of a tensor that covers range() starting at `range_begin`.
    Tensor of(const Tensor& t, int64_t range_begin) const {
      return t.view(begin - range_begin, {end - begin});
    }
  };
  // The whole layout's state tensors; the subclass's constructor calls init_state after it
  // knows them.
  virtual std::vector<StateSpec> whole_state() const = 0;
  // Where element boundary x of the layout falls in whole state tensor i: monotone, 0 at 0 and
  // whole_state()[i].numel at layout total. The state of elements [a, b) is [pos(a), pos(b)).
  virtual int64_t state_position(size_t i, int64_t x) const = 0;
  // Updates one piece: `w` and `g` are its weights (f32, or bf16 for pure bf16 AdamW) and
  // gradients; state through state_view.
  virtual void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
                      float grad_scale) = 0;
  // The same, and `working` = the updated w rounded (step_master). Default: update, convert.
  virtual void update_master(const Piece& piece, Tensor& w, Tensor& working, const Tensor& g,
                             float lr, float grad_scale);

  // Allocates range()'s slices of whole_state() from `pool`, or leaves them to bind_state when
  // pool is null.
  void init_state(MemoryPool* pool, const std::string& tag_prefix);
  // State tensor i at whole-tensor position [at, at + n): a view of this range's slice.
  Tensor state_view(size_t i, int64_t at, int64_t n) const;
  // The parameter containing element x, or the first starting after it; params().size() if none.
  size_t param_at(int64_t x) const;
  // The scratch (scratch_elements() f32 values; allocated or set).
  const Tensor& scratch() const;

  OptimConfig config_;
  const ParamLayout& layout_;
  ElementRange range_;
  int64_t t_ = 0;

 private:
  template <class F>
  void for_each_piece(F&& f) const;
  // for_each_piece over bf16 gradients: f(chunk, its gradients widened into widen_).
  template <class F>
  void for_each_widened(const Tensor& grads, F&& f);

  std::vector<StateSpec> whole_, specs_;
  std::vector<ElementRange> extents_;  // range()'s, per state tensor
  std::vector<Tensor> state_;
  Tensor widen_;  // bf16 gradients' f32 chunk (set_grad_widen)
  Tensor scratch_;
};

// bf16 gradients are widened in chunks of about kGradWidenChunk elements: the parts of a piece
// between the cuts opt.next_cut(k * kGradWidenChunk), k = 1, 2, ... (the same grid whatever the
// range, so a range's chunks are never larger than the whole layout's). `f(begin, end)` for
// each chunk of [begin, end), in order.
inline constexpr int64_t kGradWidenChunk = int64_t{1} << 20;  // 4 MiB of f32
template <class F>
void grad_widen_chunks(const Optimizer& opt, int64_t begin, int64_t end, F&& f) {
  int64_t x = begin;
  while (x < end) {
    int64_t k = x / kGradWidenChunk + 1, y = opt.next_cut(k * kGradWidenChunk);
    while (y <= x) y = opt.next_cut(++k * kGradWidenChunk);
    y = std::min(y, end);
    f(x, y);
    x = y;
  }
}
// The largest chunk any range of `opt`'s optimizer widens: the f32 buffer set_grad_widen
// needs, the same for every range (what the planner counts, Category::staging).
int64_t grad_widen_elements(const Optimizer& opt);
int64_t grad_widen_elements(const OptimConfig& config, const ParamLayout& layout);

// The whole layout as a range.
inline ElementRange whole_range(const ParamLayout& layout) { return {0, layout.total()}; }

// The optimizer `config.name` names (optimizer_names() lists them), after check_optim_config,
// over `range` (the whole layout when absent) with its state from `pool`, or unallocated (for
// bind_state) when pool is null. ConfigError if the range is not inside the layout or not cut
// where the optimizer's state allows.
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config, const ParamLayout& layout,
                                          MemoryPool* pool,
                                          std::optional<ElementRange> range = std::nullopt);
inline std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config,
                                                 const ParamLayout& layout, MemoryPool& pool) {
  return make_optimizer(config, layout, &pool);
}
// The bytes make_optimizer(config, layout, pool, range) would allocate, without allocating.
// This is what the planner predicts.
size_t optimizer_state_bytes(const OptimConfig& config, const ParamLayout& layout,
                             std::optional<ElementRange> range = std::nullopt);
// The scratch bytes alone (Optimizer::scratch_bytes), the same for every range: what an
// offloaded optimizer allocates in RAM beside its ring.
size_t optimizer_scratch_bytes(const OptimConfig& config, const ParamLayout& layout);
// Optimizer::update_flops of the optimizer over `range` (the whole layout when absent).
double optimizer_update_flops(const OptimConfig& config, const ParamLayout& layout,
                              std::optional<ElementRange> range = std::nullopt);

}  // namespace memfit
