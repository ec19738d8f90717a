#include "memfit/model/transformer.h"

#include "memfit/model/sequence_parallel.h"
#include "memfit/model/tensor_partial_sums.h"
#include "memfit/model/tensor_slices.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/fill.h"
#include "memfit/model/fp8_shard.h"
#include "memfit/model/initial_weights.h"
#include "memfit/model/stage_offsets.h"

namespace memfit {

using namespace kernels;

Transformer::Transformer(const ModelConfig& config, MemoryPool& pool,
                         const PrecisionOptions& precision, ModelState state)
    : config_(config),
      pool_(pool),
      layout_((config_.finalize(), config_)),
      precision_(precision) {
  check_precision_options(precision);
  const Precision p = precision.precision;
  master_range_ = state.master_range.value_or(ElementRange{0, layout_.total()});
  const ElementRange whole{0, layout_.total()};
  MEMFIT_CHECK(whole.contains(master_range_), "model",
               "master range [{}, {}) outside the layout of {} elements", master_range_.begin,
               master_range_.end, layout_.total());
  sharded_ = state.params_sharded;
  MEMFIT_CHECK(!sharded_ || state.master_range.has_value(), "model",
               "stage 3's working weights are the rank's shard, its master range");
  // (Without master weights there are none to keep elsewhere: fp32, pure bf16, LoRA's frozen
  // base, whose file nothing writes back: Note [LoRA], "The frozen base on disk".)
  const bool has_master = p != Precision::fp32 && precision.master_weights;
  MEMFIT_CHECK(!state.params_in_file ||
                   ((!state.master_in_ram || !has_master) && (sharded_ || !state.master_range)),
               "model",
               "offloaded working weights need the master weights elsewhere, and one process or "
               "ZeRO stage 3");
  MEMFIT_CHECK(!(sharded_ || state.params_in_file) || state.make_weights, "model",
               "sharded or offloaded working weights need their source");
  // Stage 3: the working weights of this rank's shard alone (Note [ZeRO stage 3]); offloaded,
  // none (the file source holds the persistent units, and at stage 3 the shard is in the file).
  // A quantized base (Note [NF4 weights], "QLoRA"; Note [Int8 weights]): the working slab
  // without the blocks' linears, which live as NF4 or int8 in a buffer of their own; one
  // process, in RAM, no master weights.
  if (state.base_quant) {
    MEMFIT_CHECK(!sharded_ && !state.params_in_file && master_range_ == whole &&
                     !state.make_grads && (p == Precision::fp32 || !precision.master_weights),
                 "model",
                 "a quantized base is built in one process with every weight in RAM and no "
                 "master weights");
    int64_t compact = 0;
    compact_ = layout_.compact_offsets(&compact);
    quant_.emplace(config_, *state.base_quant);
    params_ = Tensor::empty(pool, {compact}, half_dtype(p), Category::params, "params");
    quant_buffer_ =
        Tensor::empty(pool, {static_cast<int64_t>(quant_->bytes())}, DType::u8, Category::params,
                      fmt::format("base.{}", kernels::weight_quant_name(*state.base_quant)));
  } else if (state.params_fp8) {
    // Note [FP8], "Storage": the master weights and the working weights whole in RAM, the
    // linears' codes encoded from the master (refresh_working).
    // At ZeRO stages 1-2 the master weights are this rank's shard (model/fp8_shard.h).
    MEMFIT_CHECK(p == Precision::fp8 && precision.master_weights && state.master_in_ram &&
                     !sharded_ && !state.params_in_file,
                 "model",
                 "stored FP8 weights need --precision fp8 with FP32 master weights in RAM and "
                 "the working weights whole in RAM (ZeRO stages 0-2, no offload)");
    int64_t compact = 0;
    compact_ = layout_.compact_offsets(&compact);
    fp8_.emplace(layout_);
    params_ = Tensor::empty(pool, {compact}, half_dtype(p), Category::params, "params");
    fp8_buffer_ = Tensor::empty(pool, {static_cast<int64_t>(fp8_->bytes())}, DType::u8,
                                Category::params, "params.fp8");
  } else if (!state.params_in_file) {
    params_ = Tensor::empty(pool, {sharded_ ? master_range_.size() : layout_.total()},
                            half_dtype(p), Category::params, "params");
  }
  if (p != Precision::fp32 && precision.master_weights && state.master_in_ram)
    master_ = Tensor::empty(pool, {master_range_.size()}, DType::f32, Category::master, "master");
  // The whole f32 gradient slab comes with the step plan: reserve() allocates it, or places it
  // in the activations arena (Note [Gradients by lifetime]). Here only the per-unit reduction
  // of stages 0-1 (whole, f32) takes it, as its accumulator. Sharded gradients (stages 2-3:
  // Note [Sharded gradients]) and bf16 ones (--grad-dtype bf16) have the store's accumulator
  // instead, and a store of a file (--offload-grads) no slab.
  if (state.make_grads && state.grads_into_slab)
    grads_ = Tensor::empty(pool, {layout_.total()}, DType::f32, Category::grads, "grads");
  if (sharded_ || state.params_in_file) {
    source_ = state.make_weights(pool, layout_, params_, half_dtype(p));
  } else if (quant_) {
    weights_ = layout_.views_without_linears(params_);
    for (const QuantMatrix& m : quant_->matrices())
      weights_.blocks[static_cast<size_t>(m.layer)].quant[static_cast<size_t>(m.slot)] =
          quant_->view(quant_buffer_, m);
  } else if (fp8_) {
    weights_ = layout_.views_without_linears(params_);
    const Tensor scales = fp8_->scales(fp8_buffer_);
    for (const Fp8Matrix& m : fp8_->matrices())
      weights_.blocks[static_cast<size_t>(m.layer)].fp8[static_cast<size_t>(m.slot)] = {
          fp8_->codes(fp8_buffer_, m), scales.view(static_cast<int64_t>(m.index), {1})};
  } else {
    weights_ = layout_.views(params_);
  }
  grad_views_ = layout_.views(grads_);
  if (state.make_grads) {
    store_ = state.make_grads(pool, layout_, state.grads_into_slab ? grads_ : Tensor{});
    store_sums_ = store_->summed() != nullptr;
  }
}

Tensor Transformer::grad_sums(ElementRange r) {
  const ElementRange have = grad_sums_range();
  MEMFIT_CHECK(have.contains(r), "model", "the gradients of [{}, {}) outside the summed [{}, {})",
               r.begin, r.end, have.begin, have.end);
  if (r == have) return grad_sums();
  return grad_sums().view(r.begin - have.begin, {r.size()});
}

void Transformer::add_lora(const LoraOptions& options, uint64_t seed, bool freeze_base) {
  MEMFIT_CHECK(!lora_, "lora", "the model has its adapters already");
  MEMFIT_CHECK(B_ == 0, "lora", "add the adapters before reserve()");
  // One process or stage 0 (every weight in RAM), stage 3's gathered base, or the base's
  // blocks read from their file (one process, or each rank's shard at stage 3), read only: the
  // adapters are bound into the source's views after each gather or read (Note [LoRA], "ZeRO
  // stage 3" and "The frozen base on disk"). No per-unit gradients (the base has none) and no
  // sharded master weights.
  MEMFIT_CHECK(!store_ && (sharded_ || params_offloaded() ? source_ != nullptr
                                                          : !source_ && master_range_ == whole()),
               "lora",
               "LoRA is built in one process or at ZeRO stage 0 or 3, with no per-unit "
               "gradients");
  // bf16 (Note [LoRA], "bf16"): the frozen base is its bf16 working weights alone; the
  // adapters are f32 (their own master weights).
  const Precision p = precision_.precision;
  MEMFIT_CHECK(p == Precision::fp32 || (p == Precision::bf16 && !master_.defined() && freeze_base),
               "lora",
               "LoRA is built for fp32, and for bf16 with a frozen base and no master weights "
               "(PrecisionOptions::master_weights false), got {}{}",
               precision_name(p), master_.defined() ? " with master weights" : "");
  const std::optional<WeightQuant> have =
      quant_ ? std::optional<WeightQuant>(quant_->format()) : std::nullopt;
  MEMFIT_CHECK(options.base_quant() == have && (!quant_ || freeze_base), "lora",
               "--base-dtype {} on a model with {} base{}", lora_base_name(options.base),
               have ? weight_quant_name(*have) : "an unquantized",
               quant_ && !freeze_base ? " (which is frozen)" : "");
  lora_.emplace(config_, options);
  lora_weights_ = Tensor::empty(pool_, {lora_->total()}, DType::f32, Category::params,
                                "lora.params");
  lora_grads_ = Tensor::empty(pool_, {lora_->total()}, DType::f32, Category::grads, "lora.grads");
  lora_->init(lora_weights_, seed, group_ ? group_->rank() : 0);  // --tp: the rank's slices
  kernels::zero(lora_grads_);
  frozen_ = freeze_base;
  if (frozen_) grads_ = Tensor{};
  grad_views_ = layout_.views(grads_);
  bind_lora();
}

void Transformer::bind_lora() {
  if (!lora_) return;
  if (source_)  // stage 3, or the base's file: into the views, after every gather or read
    source_->set_bind_hook([this](ModelWeights& w) { lora_->bind(w, lora_weights_); });
  else
    lora_->bind(weights_, lora_weights_);
  lora_->bind(grad_views_, lora_grads_);
}

void Transformer::zero_grad() {
  if (lora_grads_.defined()) kernels::zero(lora_grads_);
  if (grads_in_arena()) return;  // each unit is zeroed as it is born (StepContext::enter)
  if (store_)
    store_->zero();
  else if (grads_.defined())  // (before reserve() there is no slab yet)
    kernels::zero(grads_);
}

Tensor Transformer::param(const std::string& name) const {
  MEMFIT_CHECK(!sharded_, "model", "param('{}'): the working weights are a ZeRO-3 shard", name);
  MEMFIT_CHECK(!params_offloaded(), "model", "param('{}'): the working weights are on disk",
               name);
  if (!compact_.empty()) {
    const auto& ps = layout_.params();
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].name != name) continue;
      MEMFIT_CHECK(compact_[i] >= 0, "model", "param('{}'): a block linear stored {}", name,
                   quant_ ? "in the quantized base" : "as FP8 (fp8_buffer())");
      return params_.view(compact_[i], ps[i].shape);
    }
    (void)layout_.find(name);  // throws: no such parameter
  }
  return layout_.view(params_, name);
}

int64_t Transformer::working_offset(size_t i) const {
  return compact_.empty() ? layout_.params().at(i).offset : compact_.at(i);
}

Tensor Transformer::grad(const std::string& name) const {
  MEMFIT_CHECK(grads_.defined(), "model",
               "grad('{}'): no gradient slab (before reserve(), or a ZeRO shard's sums: "
               "grad_sums())",
               name);
  return layout_.view(grads_, name);
}

void Transformer::working_changed() {
  if (source_) source_->refresh();
}

void Transformer::refresh_working() {
  if (!master_.defined()) {
    working_changed();
    return;
  }
  if (fp8_) {
    // Over a shard of master weights the ranks agree on the scales first: the exchange
    // refreshes (dist/zero/fp8_publish.h).
    MEMFIT_CHECK(whole_weights(), "model",
                 "stored FP8 weights over a shard of master weights [{}, {}) are refreshed by "
                 "the ranks' exchange (publish_fp8_weights)",
                 master_range_.begin, master_range_.end);
    refresh_fp8(whole());
  } else if (whole_weights() || sharded_) {
    if (params_.numel() > 0) convert(params_, master_);
  } else if (!master_range_.empty()) {
    Tensor working = params_.view(master_range_.begin, {master_range_.size()});
    convert(working, master_);
  }
  working_changed();
}

// Note [FP8], "Storage": the compact slab's parameters as refresh_working rounds them, the
// linears encoded from the same master weights.
void Transformer::refresh_fp8(ElementRange range) {
  const auto& ps = layout_.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (compact_[i] < 0 || !range.contains({ps[i].offset, ps[i].offset + ps[i].numel})) continue;
    Tensor working = params_.view(compact_[i], {ps[i].numel});
    convert(working, master_.view(ps[i].offset - master_range_.begin, {ps[i].numel}));
  }
  fp8_weights_encode(*fp8_, master_, master_range_.begin, range, fp8_buffer_, fp8_agree());
}

Fp8AmaxAgree Transformer::fp8_agree() const {
  if (group_ == nullptr || group_->size() == 1) return {};
  return [group = group_](std::span<float> amax) { fp8_amax_agree(*group, amax); };
}

void Transformer::refresh_working(ElementRange range) {
  MEMFIT_CHECK(fp8_.has_value(), "model", "refresh_working(range) is for stored FP8 weights");
  refresh_fp8(range);
}

void Transformer::set_weights(const RangeFill& fill, int64_t piece_elements,
                              const MasterSink& offloaded_master) {
  MEMFIT_CHECK(piece_elements > 0, "model", "set_weights: a piece of {} elements",
               piece_elements);
  if (quant_) {
    set_weights_quant(fill, piece_elements, true);
    return;
  }
  if (fp8_ && whole_weights()) {  // the master weights whole in RAM: filled in place, encoded
    fill(0, layout_.total(), master_.data<float>());
    refresh_working();
    return;
  }
  if (fp8_) {
    // A shard of master weights (ZeRO stages 1-2): the shard filled in place, the whole
    // working copy computed here from `fill` through one staging piece (model/fp8_shard.h: no
    // exchange; the bytes one process's refresh gives).
    fill(master_range_.begin, master_range_.end, master_.data<float>());
    int64_t largest = 1;
    for (const ParamInfo& q : layout_.params()) largest = std::max(largest, q.numel);
    Tensor piece = Tensor::empty(pool_, {std::min(piece_elements, largest)}, DType::f32,
                                 Category::staging, "setup.piece");
    fp8_weights_fill(layout_, compact_, params_, *fp8_, fp8_buffer_, fill, piece, fp8_agree());
    return;
  }
  if (params_offloaded()) {
    // The working copy lives in RAM (persistent units) and the file (Note [NVMe offload],
    // "Working weights on disk"): the offloaded master weights first, then the working copy
    // a unit's part at a time through one staging piece, rounded as below.
    if (offloaded_master) offloaded_master(fill);
    Tensor piece = Tensor::empty(pool_, {std::min(piece_elements, source_->largest_part())},
                                 DType::f32, Category::staging, "setup.piece");
    source_->store_from(fill, piece);
    piece = Tensor{};
    working_changed();  // stage 3: the persistent units gathered, every rank at this point
    return;
  }
  const ElementRange P = params_range();
  const DType working = params_.dtype();
  const size_t es = dtype_size(working);
  auto* params = static_cast<std::byte*>(params_.raw_data());
  // The working copy of [from, to) from f32 values, rounded as refresh_working rounds.
  auto round_into_working = [&](int64_t from, int64_t to, const float* src) {
    convert_n_team(DType::f32, working, params + static_cast<size_t>(from - P.begin) * es, src,
                   to - from);
  };
  // Where the f32 weights of record take the values in place: the master weights (in RAM or
  // the caller's), or f32 working weights without them. `direct` lies within P.
  ElementRange direct{P.begin, P.begin};
  const bool has_direct = master_.defined() || offloaded_master || working == DType::f32;
  if (has_direct) direct = master_.defined() || offloaded_master ? master_range_ : P;
  // The rest of P (at stages 1-2 the other ranks' parts of the whole working copy; all of it
  // for bf16 weights of record) through one staging piece, in increasing order around `direct`.
  const int64_t rest = P.size() - direct.size();
  Tensor piece;
  if (rest > 0)
    piece = Tensor::empty(pool_, {std::min(piece_elements, rest)}, DType::f32,
                          Category::staging, "setup.piece");
  auto staged = [&](ElementRange part) {
    for (int64_t a = part.begin; a < part.end; a += piece.numel()) {
      const int64_t b = std::min(part.end, a + piece.numel());
      fill(a, b, piece.data<float>());
      round_into_working(a, b, piece.data<float>());
    }
  };
  staged({P.begin, direct.begin});
  if (!direct.empty()) {
    if (master_.defined()) {
      fill(direct.begin, direct.end, master_.data<float>());
    } else if (offloaded_master) {
      offloaded_master([&](int64_t from, int64_t to, float* dst) {
        fill(from, to, dst);
        round_into_working(from, to, dst);
      });
    } else {
      fill(direct.begin, direct.end, params_.data<float>());
    }
  }
  staged({direct.end, P.end});
  piece = Tensor{};
  refresh_working();  // the master's range rounded into the working copy; stage 3's gathers
}

// A quantized base's load (Note [NF4 weights], "QLoRA"; Note [Int8 weights]): the parameters
// other than the block linears through one staging piece into the compact working slab
// (rounded as refresh_working rounds), then the linears quantized a piece of whole rows at a
// time (quant_base_quantize), NF4 with its blocks' absmax in a second staging buffer (int8
// needs none); both freed before the step. No whole tensor is ever held: RAM is the slab, the
// quantized buffer, the piece and (NF4) the largest matrix's absmax.
void Transformer::set_weights_except_quant_base(const RangeFill& fill, int64_t piece_elements) {
  MEMFIT_CHECK(quant_.has_value(), "model",
               "set_weights_except_quant_base without a quantized base");
  set_weights_quant(fill, piece_elements, false);
}

void Transformer::set_weights_quant(const RangeFill& fill, int64_t piece_elements,
                                    bool quantize) {
  // At most piece_elements and the largest tensor, at least a piece of rows that starts where
  // the format allows in every matrix (quant_base_quantize).
  int64_t largest = 0;
  for (const QuantMatrix& m : quant_->matrices()) largest = std::max(largest, m.rows * m.cols);
  for (const ParamInfo& p : layout_.params()) largest = std::max(largest, p.numel);
  const int64_t n = std::max(std::min(piece_elements, largest), quant_->min_piece_elements());
  Tensor piece = Tensor::empty(pool_, {n}, DType::f32, Category::staging, "setup.piece");
  const DType working = params_.dtype();
  const size_t es = dtype_size(working);
  auto* params = static_cast<std::byte*>(params_.raw_data());
  const auto& ps = layout_.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (compact_[i] < 0) continue;
    for (int64_t a = 0; a < ps[i].numel; a += n) {
      const int64_t b = std::min(ps[i].numel, a + n);
      fill(ps[i].offset + a, ps[i].offset + b, piece.data<float>());
      convert_n_team(DType::f32, working, params + static_cast<size_t>(compact_[i] + a) * es,
                     piece.data<float>(), b - a);
    }
  }
  if (!quantize) return;
  Tensor scratch;
  if (const size_t bytes = quant_->quantize_scratch_bytes())
    scratch = Tensor::empty(pool_, {static_cast<int64_t>(bytes / sizeof(float))}, DType::f32,
                            Category::staging, "setup.nf4_absmax");
  quant_base_quantize(*quant_, quant_buffer_, fill, piece, scratch);
}

void Transformer::read_base_range(ElementRange range, const BaseTake& take,
                                  const Tensor& staging) const {
  MEMFIT_CHECK(quant_.has_value(), "model", "read_base_range without a quantized base");
  const DType dt = params_.dtype();
  const size_t es = dtype_size(dt);
  const int64_t cap = static_cast<int64_t>(staging.nbytes() / es);
  MEMFIT_CHECK(cap > 0, "model", "a staging of {} bytes for {} values", staging.nbytes(),
               dtype_name(dt));
  auto* stage = static_cast<std::byte*>(staging.raw_data());
  const auto* params = static_cast<const std::byte*>(params_.raw_data());
  const auto& ps = layout_.params();
  size_t i = 0;
  int64_t a = range.begin;
  while (a < range.end) {
    while (i < ps.size() && ps[i].offset + ps[i].numel <= a) ++i;
    if (i == ps.size() || a < ps[i].offset) {  // alignment padding: zeros
      const int64_t b = std::min({range.end, i == ps.size() ? range.end : ps[i].offset, a + cap});
      std::memset(stage, 0, static_cast<size_t>(b - a) * es);
      take(a, b, stage);
      a = b;
      continue;
    }
    const int64_t end = std::min(range.end, ps[i].offset + ps[i].numel);
    if (compact_[i] >= 0) {
      take(a, end, params + static_cast<size_t>(compact_[i] + a - ps[i].offset) * es);
      a = end;
      continue;
    }
    const QuantMatrix* m = nullptr;
    for (const QuantMatrix& x : quant_->matrices())
      if (x.layout_offset <= a && a < x.layout_offset + x.rows * x.cols) m = &x;
    MEMFIT_CHECK(m != nullptr, "model", "no quantized matrix holds layout element {}", a);
    const kernels::QuantWeight w = quant_->view(quant_buffer_, *m);
    for (; a < end;) {
      const int64_t b = std::min(end, a + cap);
      kernels::quant_dequantize_n(w, a - m->layout_offset, b - a, dt, stage);
      take(a, b, stage);
      a = b;
    }
  }
}

void Transformer::init_weights(uint64_t seed, int64_t piece_elements) {
  init_weights(seed, piece_elements, {});
}

void Transformer::init_weights(uint64_t seed, int64_t piece_elements,
                               const MasterSink& offloaded_master) {
  if (config_.tp > 1) {
    // This rank's slice of the whole model's draw: the one-process run's values (tensor_slices.h).
    // The slices map onto the same stage at tp 1, which lies at its whole_offset() in the whole
    // model's layout (a pipeline stage of tensor groups, Note [Pipeline parallel]; 0 otherwise).
    MEMFIT_CHECK(group_ != nullptr, "model", "init_weights under --tp {} before set_tensor_group",
                 config_.tp);
    const ModelConfig stage_whole = whole_model(config_);
    const int64_t at = ParamLayout(stage_whole).whole_offset();
    ModelConfig whole = stage_whole;
    whole.set_pipeline_stage({});
    const ParamLayout whole_layout(whole);
    const std::vector<SliceRun> runs = tensor_slice_runs(config_, group_->rank());
    // A tied model's last stage: its copy of the table lies at the end of the stage's tp 1
    // layout and draws as the table, whose elements start the whole model (as below).
    const ElementRange copy = tied_table_copy(ParamLayout(stage_whole));
    InitialWeights draw(whole, whole_layout, seed);
    set_weights(
        [&](int64_t from, int64_t to, float* dst) {
          fill_from_whole(runs, {from, to}, dst, [&](int64_t a, int64_t b, float* d) {
            const int64_t split = copy.empty() ? b : std::clamp(copy.begin, a, b);
            draw.draw({at + a, at + split}, d);
            draw.draw({split - copy.begin, b - copy.begin}, d + (split - a));
          });
        },
        piece_elements, offloaded_master);
    return;
  }
  if (config_.pipelined()) {
    // A pipeline stage: its run of the whole model's draw (ParamLayout::whole_offset), the
    // one-process run's values; a tied model's last stage draws its copy of the token table as
    // the table (model/stage_offsets.h), so the first and last stages start identical.
    ModelConfig whole = config_;
    whole.set_pipeline_stage({});
    const ParamLayout whole_layout(whole);
    const int64_t at = layout_.whole_offset();
    const ElementRange copy = tied_table_copy(layout_);
    InitialWeights draw(whole, whole_layout, seed);
    set_weights(
        [&](int64_t from, int64_t to, float* dst) {
          const int64_t split = copy.empty() ? to : std::clamp(copy.begin, from, to);
          draw.draw({at + from, at + split}, dst);
          draw.draw({split - copy.begin, to - copy.begin}, dst + (split - from));
        },
        piece_elements, offloaded_master);
    return;
  }
  InitialWeights draw(config_, layout_, seed);
  set_weights([&](int64_t from, int64_t to, float* dst) { draw.draw({from, to}, dst); },
              piece_elements, offloaded_master);
}

void Transformer::reduce_kv_replicas() {
  if (config_.kv_replicas() == 1 || group_ == nullptr || frozen_) return;  // (LoRA: no sums)
  // The summed gradients this rank holds: the whole layout, or its ZeRO shard (stages 2-3),
  // the same range on every rank of the tensor group (they share a data index and a layout).
  sum_kv_replicas(*group_, config_, layout_, grad_sums(), grad_sums_range());
}

void Transformer::reduce_sequence_partials() {
  if (group_ == nullptr || !ctx_.running() || frozen_ ||  // a frozen base has no gradients
      !sequence_parallel(config_, ctx_.plan().options))
    return;
  // Over the summed gradients this rank holds (the whole slab, or its ZeRO shard at stages
  // 2-3: the same range on every rank of the tensor group), so the data group's reduction has
  // already summed each part; a part of a norm another data rank holds is summed there.
  sum_sequence_partials(*group_, layout_, grad_sums(), grad_sums_range());
}

void Transformer::reduce_lora_partials() {
  if (!lora_ || group_ == nullptr || group_->size() <= 1) return;
  // The adapters' matrices every tensor rank holds whole (Note [LoRA], "Under --tp"): each
  // rank's gradient is its share, summed over the group in rank order, in place.
  float* g = lora_grads_.data<float>();
  for (const ElementRange& r : lora_->replicated_ranges())
    group_->all_reduce_sum({g + r.begin, static_cast<size_t>(r.size())});
}

void Transformer::set_tensor_group(TensorGroup& group) {
  MEMFIT_CHECK(group.size() == config_.tp, "model",
               "a tensor group of {} ranks for a model split over --tp {}", group.size(),
               config_.tp);
  group_ = &group;
  ctx_.set_tensor_group(group_);
}

void Transformer::reserve(int B, int T, const ActivationOptions& options_in) {
  ActivationOptions options = options_in;
  options.precision = precision_.precision;
  options.lora_rank = lora_ ? lora_->options().rank : 0;
  options.lora_dropout = lora_ ? lora_->options().dropout : 0.0f;
  options.base_quantized = quant_.has_value();
  MEMFIT_CHECK_SHAPE(B > 0 && T > 0 && T <= config_.max_seq_len, "model",
                     "batch {} x {} tokens does not fit a context of {}", B, T,
                     config_.max_seq_len);
  if (B == B_ && T == T_ && ctx_.running()) {
    // The plan's options as they were asked for (plan_step records the chunk it chose): equal
    // in every field, the plan is the one asked for now.
    ActivationOptions asked = ctx_.plan().options;
    asked.lm_head_chunk = ctx_.plan().lm_head_chunk_asked;
    if (options == asked) return;
  }
  reserve(plan_step(config_, B, T, options));
}

void Transformer::reserve(StepPlan plan) {
  MEMFIT_CHECK(plan.options.precision == precision_.precision && plan.B > 0 && plan.T > 0 &&
                   plan.T <= config_.max_seq_len,
               "model", "a step plan for {} x {} tokens in {} does not fit this {} model", plan.B,
               plan.T, precision_name(plan.options.precision),
               precision_name(precision_.precision));
  const bool in_arena = plan.options.grads_in_arena, inference = plan.options.inference;
  // The whole f32 slab is the model's own unless the gradients live per unit; an inference
  // plan, whose step has no backward, holds none (Note [Inference plan]).
  MEMFIT_CHECK(plan.options.lora_rank == (lora_ ? lora_->options().rank : 0), "model",
               "a step plan for LoRA rank {} on a model with rank {}", plan.options.lora_rank,
               lora_ ? lora_->options().rank : 0);
  MEMFIT_CHECK(plan.options.lora_dropout == (lora_ ? lora_->options().dropout : 0.0f), "model",
               "a step plan for LoRA dropout {} on a model with dropout {}",
               plan.options.lora_dropout, lora_ ? lora_->options().dropout : 0.0f);
  MEMFIT_CHECK(plan.options.base_quantized == quant_.has_value(), "model",
               "a step plan {} a quantized base for a model {} one",
               plan.options.base_quantized ? "with" : "without", quant_ ? "with" : "without");
  MEMFIT_CHECK(!quant_ || (lora_ && frozen_) || plan.options.inference, "model",
               "a quantized base trains LoRA adapters alone: add_lora before a training plan");
  // A frozen base (LoRA) has no gradient slab either.
  const bool per_unit = store_ != nullptr, own_slab = !per_unit && !inference && !frozen_;
  MEMFIT_CHECK(!in_arena || own_slab, "model",
               "gradients in the activations arena need the whole f32 slab (no per-unit "
               "reduction, no --offload-grads)");
  // The old arenas go first, so reserving again never holds two plans at once; so does a slab
  // the arena will hold (Note [Gradients by lifetime]), a view of the old arena, and a slab an
  // inference plan has no use for.
  if (!per_unit && (in_arena || grads_in_arena() || inference)) grads_ = Tensor{};
  ctx_ = StepContext();
  step_.reset();
  B_ = T_ = 0;
  if (own_slab && !in_arena && !grads_.defined())
    grads_ = Tensor::empty(pool_, {layout_.total()}, DType::f32, Category::grads, "grads");
  std::array<Tensor, kNumCategories> arenas;
  for (Category c : {Category::activations, Category::workspace}) {
    const size_t bytes = plan.arena[static_cast<size_t>(c)];
    if (bytes == 0) continue;
    arenas[static_cast<size_t>(c)] =
        Tensor::empty(pool_, {static_cast<int64_t>(bytes)}, DType::i8, c, arena_tag(c));
  }
  if (in_arena)  // the slab's units lie at their layout offsets from the arena's start
    grads_ = arenas[static_cast<size_t>(Category::activations)].view_bytes(0, {layout_.total()},
                                                                           DType::f32);
  if (!per_unit) grad_views_ = layout_.views(grads_);
  bind_lora();
  std::vector<Tensor> views;
  for (const BufferSpec& b : plan.buffers)
    views.push_back(arenas[static_cast<size_t>(arena_category(b.category))].view_bytes(
        b.offset, b.shape, b.dtype));
  B_ = plan.B;
  T_ = plan.T;
  step_ = std::make_unique<TransformerStep>(config_, plan.options, plan.B, plan.T);
  ctx_ = StepContext(std::move(plan), std::move(views));
  ctx_.set_poison(poison_);
  ctx_.set_observer(observer_);
  ctx_.set_tensor_group(group_);
  if (source_) source_->set_phases(ctx_.plan().phases);
  if (source_ || store_) {
    // Stage 3 gathers the weights a phase reads; per-unit gradients give a block's backward
    // its slot.
    ctx_.set_enter_hook([this](int phase) {
      if (source_) source_->enter(phase);
      const Phase& p = ctx_.plan().phases[static_cast<size_t>(phase)];
      if (store_ && p.kind == PhaseKind::backward) store_->enter_backward(p.layer);
      if (store_ && p.kind == PhaseKind::embedding_backward) store_->enter_embedding_backward();
    });
  }
  backward_ready_ = false;
}

const Tensor& Transformer::buffer(const std::string& tag) const { return ctx_.view(tag); }

float Transformer::forward(const Tensor& tokens, const Tensor& targets, bool training,
                           float loss_scale) {
  MEMFIT_CHECK(B_ > 0, "model", "forward before reserve()");
  expect_tensor(tokens, "model", "tokens", {B_, T_}, DType::i32);
  expect_tensor(targets, "model", "targets", {B_, T_}, DType::i32);
  const float N = static_cast<float>(int64_t{B_} * T_);
  MEMFIT_CHECK(!training || !ctx_.plan().options.inference, "model",
               "a training forward on a model reserved for inference (a forward alone: no "
               "saved activations, no gradients); reserve it for training first");
  backward_ready_ = false;
  if (training && store_) store_->begin_micro_batch();
  step_->set_lora_draw(lora_draw_);
  step_->set_stage_io(stage_io_);
  const float loss_sum =
      step_->forward(ctx_, working_views(), grad_views(), &tokens, &targets, training,
                     loss_scale / N);
  backward_ready_ = training;
  return loss_sum / N;
}

float Transformer::forward_masked(const Tensor& tokens, const Tensor& targets,
                                  const Tensor& mask, bool training, float dloss) {
  MEMFIT_CHECK(B_ > 0, "model", "forward before reserve()");
  expect_tensor(tokens, "model", "tokens", {B_, T_}, DType::i32);
  expect_tensor(targets, "model", "targets", {B_, T_}, DType::i32);
  expect_tensor(mask, "model", "loss mask", {B_, T_}, DType::u8);
  MEMFIT_CHECK(!training || !ctx_.plan().options.inference, "model",
               "a training forward on a model reserved for inference; reserve it for training");
  backward_ready_ = false;
  if (training && store_) store_->begin_micro_batch();
  step_->set_lora_draw(lora_draw_);
  step_->set_stage_io(stage_io_);
  const float loss_sum = step_->forward(ctx_, working_views(), grad_views(), &tokens, &targets,
                                        training, dloss, &mask);
  backward_ready_ = training;
  return loss_sum;
}

void Transformer::backward() { backward(nullptr); }

void Transformer::backward(const std::function<void(int64_t final_from)>& final_from) {
  MEMFIT_CHECK(backward_ready_, "model", "backward() without a training forward() before it");
  backward_ready_ = false;
  step_->set_stage_io(stage_io_);
  if (store_) {
    step_->backward(ctx_, working_views(), grad_views(), [&](int part) { store_->done(part); });
    return;
  }
  if (!final_from) {
    step_->backward(ctx_, working_views(), grad_views_);
    return;
  }
  // The first element of each block and of the final norm (the parts after it, an untied head,
  // were finished by the forward's fused head).
  std::vector<int64_t> first(static_cast<size_t>(config_.n_layer) + 1, layout_.total());
  for (const ParamInfo& p : layout_.params()) {
    const size_t part = p.layer >= 0 ? static_cast<size_t>(p.layer)
                                      : (p.role == ParamRole::norm_weight ? first.size() - 1
                                                                           : first.size());
    if (part < first.size()) first[part] = std::min(first[part], p.offset);
  }
  step_->backward(ctx_, working_views(), grad_views_,
                  [&](int part) { final_from(part < 0 ? 0 : first[static_cast<size_t>(part)]); });
}

void Transformer::logits(const Tensor& tokens, Tensor& out) {
  MEMFIT_CHECK(B_ > 0, "model", "logits before reserve()");
  expect_tensor(tokens, "model", "tokens", {B_, T_}, DType::i32);
  expect_tensor(out, "model.logits", "logits", {B_, T_, config_.vocab_size});
  backward_ready_ = false;
  step_->logits(ctx_, working_views(), tokens, out);
}

std::string Transformer::first_non_finite() {
  // A slab over `range` of the layout (a ZeRO shard, or all of it): each parameter's part in it.
  auto scan = [&](const Tensor& slab, ElementRange range, const char* what) -> std::string {
    if (!slab.defined()) return {};
    for (const ParamInfo& p : layout_.params()) {
      const ElementRange part = range.intersect({p.offset, p.offset + p.numel});
      if (!part.empty() && !all_finite(slab.view(part.begin - range.begin, {part.size()})))
        return fmt::format("{} ({})", p.name, what);
    }
    return {};
  };
  if (std::string s = scan(master_, master_range_, "master weight"); !s.empty()) return s;
  if (!compact_.empty()) {
    const auto& ps = layout_.params();
    for (size_t i = 0; i < ps.size(); ++i)
      if (compact_[i] >= 0 && !all_finite(params_.view(compact_[i], {ps[i].numel})))
        return fmt::format("{} (weight)", ps[i].name);
    // A stored FP8 matrix's scale is NaN where its master weights were not finite.
    if (fp8_)
      for (const Fp8Matrix& m : fp8_->matrices())
        if (!std::isfinite(fp8_->scales(fp8_buffer_).data<float>()[m.index]))
          return fmt::format("layer {} linear {} (FP8 weight scale)", m.layer,
                             static_cast<int>(m.slot));
  } else if (std::string s = scan(params_, params_range(), "weight"); !s.empty()) {
    return s;
  }
  const std::vector<Tensor>& views = ctx_.views();
  for (size_t i = 0; i < views.size(); ++i) {
    const std::string& tag = ctx_.plan().buffers[i].tag;
    const Tensor& t = views[i];
    // Scratch, recomputation slots and buffers whose bytes another buffer reuses may hold
    // stale data from another block or buffer; token ids and compressed activations' codes are
    // not floats (their scales are, and a non-finite block has a NaN scale).
    if (t.dtype() == DType::i32 || t.dtype() == DType::i8 || t.dtype() == DType::u8 ||
        tag.starts_with("ws.") || tag.starts_with("rc.") ||
        ctx_.plan().buffers[i].category == Category::grads || ctx_.plan().shares_bytes(i))
      continue;
    if (!all_finite(t)) return fmt::format("{} (activation)", tag);
  }
  // The backward writes the gradients from the last layer to the embeddings (per-unit
  // gradients: their sums, of this rank's range).
  const ElementRange sums = grad_sums_range();
  const auto& ps = layout_.params();
  for (auto it = ps.rbegin(); it != ps.rend(); ++it) {
    const ElementRange part = sums.intersect({it->offset, it->offset + it->numel});
    if (!part.empty() &&
        !all_finite(grad_sums().view(part.begin - sums.begin, {part.size()})))
      return fmt::format("{} (gradient)", it->name);
  }
  return {};
}

}  // namespace memfit
