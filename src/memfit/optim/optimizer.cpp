// The optimizers' one loop (pieces of a range), their state slices, and make_optimizer /
// optimizer_state_bytes: the one place that maps an optimizer's name to its class, so the CLI's
// --optim and the planner agree on what each name allocates.
#include "memfit/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/optim/adam_mini.h"
#include "memfit/optim/adamw.h"
#include "memfit/optim/adamw4bit.h"
#include "memfit/optim/adamw8bit.h"
#include "memfit/optim/apollo.h"
#include "memfit/optim/galore.h"
#include "memfit/optim/lion.h"
#include "memfit/optim/lion8bit.h"
#include "memfit/optim/sgd.h"

namespace memfit {

Optimizer::Optimizer(const OptimConfig& config, const ParamLayout& layout,
                     std::optional<ElementRange> range)
    : config_(config), layout_(layout), range_(range.value_or(whole_range(layout))) {
  MEMFIT_CHECK(range_.begin >= 0 && range_.begin <= range_.end && range_.end <= layout.total(),
               "optim", "range [{}, {}) is not inside the parameter layout's {} elements",
               range_.begin, range_.end, layout.total());
}

void Optimizer::init_state(MemoryPool* pool, const std::string& tag_prefix) {
  // A range must start and end where the state can be cut, else its slices would split what
  // one state value describes (an 8-bit block, an Adam-mini block).
  for (int64_t x : {range_.begin, range_.end})
    MEMFIT_CHECK(x == layout_.total() || next_cut(x) == x, "optim",
                 "{}: a range cannot start or end at element {} (the state allows a cut at {})",
                 name(), x, next_cut(x));
  whole_ = whole_state();
  extents_ = state_extents(range_);
  specs_.clear();
  state_.assign(whole_.size(), Tensor{});
  for (size_t i = 0; i < whole_.size(); ++i) {
    specs_.push_back({whole_[i].name, whole_[i].dtype, extents_[i].size()});
    if (pool && extents_[i].size() > 0)
      state_[i] = Tensor::empty(*pool, {extents_[i].size()}, whole_[i].dtype, Category::optimizer,
                                fmt::format("{}.{}", tag_prefix, whole_[i].name));
  }
  if (pool && scratch_elements() > 0)
    scratch_ = Tensor::empty(*pool, {scratch_elements()}, DType::f32, Category::optimizer,
                             fmt::format("{}.scratch", tag_prefix));
}

size_t Optimizer::scratch_bytes() const {
  const int64_t n = scratch_elements();
  return n > 0 ? MemoryPool::round_up(static_cast<size_t>(n) * sizeof(float)) : 0;
}

void Optimizer::set_scratch(Tensor buffer) {
  MEMFIT_CHECK(buffer.defined() && buffer.dtype() == DType::f32 &&
                   buffer.numel() >= scratch_elements(),
               "optim", "{}: the scratch must be at least {} f32 values", name(),
               scratch_elements());
  scratch_ = std::move(buffer);
}

const Tensor& Optimizer::scratch() const {
  MEMFIT_CHECK(scratch_.defined(), "optim",
               "{}: the scratch is not allocated or set (set_scratch before step)", name());
  return scratch_;
}

std::vector<ElementRange> Optimizer::state_extents(const ElementRange& r) const {
  std::vector<ElementRange> out;
  const size_t n = whole_.empty() ? whole_state().size() : whole_.size();
  for (size_t i = 0; i < n; ++i) out.push_back({state_position(i, r.begin), state_position(i, r.end)});
  return out;
}

void Optimizer::bind_state(std::vector<Tensor> tensors) {
  MEMFIT_CHECK(tensors.size() == specs_.size(), "optim", "{}: bind_state got {} tensors, expected {}",
               name(), tensors.size(), specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    const StateSpec& s = specs_[i];
    if (s.numel == 0) continue;
    MEMFIT_CHECK(tensors[i].defined() && tensors[i].numel() == s.numel &&
                     tensors[i].dtype() == s.dtype,
                 "optim", "{}: state '{}' must be {} elements of {}, got {}", name(), s.name,
                 s.numel, dtype_name(s.dtype),
                 tensors[i].defined() ? fmt::format("{} of {}", tensors[i].numel(),
                                                    dtype_name(tensors[i].dtype()))
                                      : std::string("an undefined tensor"));
  }
  state_ = std::move(tensors);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].numel > 0) out.emplace_back(specs_[i].name, state_[i]);
  return out;
}

size_t Optimizer::state_bytes() const {
  size_t b = 0;
  for (const StateSpec& s : specs_)
    b += MemoryPool::round_up(static_cast<size_t>(s.numel) * dtype_size(s.dtype));
  return b + scratch_bytes();
}

int64_t Optimizer::next_cut(int64_t x) const {
  return std::min(layout_.total(), (x + 15) / 16 * 16);
}

size_t Optimizer::param_at(int64_t x) const {
  const auto& ps = layout_.params();
  auto it = std::partition_point(ps.begin(), ps.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= x; });
  return static_cast<size_t>(it - ps.begin());
}

Tensor Optimizer::state_view(size_t i, int64_t at, int64_t n) const {
  MEMFIT_CHECK(state_[i].defined() || n == 0, "optim",
               "{}: state '{}' is not allocated or bound (bind_state before step)", name(),
               specs_[i].name);
  return state_[i].view(at - extents_[i].begin, {n});
}

template <class F>
void Optimizer::for_each_piece(F&& f) const {
  const auto& ps = layout_.params();
  for (size_t i = param_at(range_.begin); i < ps.size() && ps[i].offset < range_.end; ++i) {
    const int64_t b = std::max(range_.begin, ps[i].offset);
    const int64_t e = std::min(range_.end, ps[i].offset + ps[i].numel);
    if (b < e) f(Piece{ps[i], i, b, e});
  }
}

namespace {
// Slabs of the range's size (ShapeError) and type (DTypeError), a usable learning rate and
// gradient scale (Error), before anything is touched.
void check_step_args(const std::string& op, const ElementRange& range, const Tensor& w,
                     DType w_dtype, const Tensor& grads, float lr, float grad_scale) {
  kernels::expect_tensor(w, op, "weights", {range.size()}, w_dtype);
  kernels::expect_tensor(grads, op, "grads", {range.size()},
                         grads.defined() && grads.dtype() == DType::bf16 ? DType::bf16
                                                                          : DType::f32);
  MEMFIT_CHECK(std::isfinite(lr) && lr >= 0.0f, op,
               "learning rate must be finite and >= 0, got {}", lr);
  MEMFIT_CHECK(std::isfinite(grad_scale), op, "grad_scale must be finite, got {}", grad_scale);
}
}  // namespace

void Optimizer::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  // Pure bf16 (no master copy): the optimizers that can round stochastically take bf16 weights.
  const bool bf16 = params.defined() && params.dtype() == DType::bf16 && updates_bf16_weights();
  check_step_args(name(), range_, params, bf16 ? DType::bf16 : DType::f32, grads, lr, grad_scale);
  ++t_;
  if (grads.dtype() == DType::bf16) {
    for_each_widened(grads, [&](const Piece& pc, const Tensor& g) {
      Tensor w = pc.of(params, range_.begin);
      update(pc, w, g, lr, grad_scale);
    });
    return;
  }
  for_each_piece([&](const Piece& pc) {
    Tensor w = pc.of(params, range_.begin);
    update(pc, w, pc.of(grads, range_.begin), lr, grad_scale);
  });
}

void Optimizer::step_master(Tensor& master, Tensor& working, const Tensor& grads, float lr,
                            float grad_scale) {
  check_step_args(name(), range_, master, DType::f32, grads, lr, grad_scale);
  MEMFIT_CHECK(working.defined() && working.numel() == range_.size(), name(),
               "the working copy must cover the range's {} elements", range_.size());
  ++t_;
  if (grads.dtype() == DType::bf16) {
    for_each_widened(grads, [&](const Piece& pc, const Tensor& g) {
      Tensor w = pc.of(master, range_.begin), h = pc.of(working, range_.begin);
      update_master(pc, w, h, g, lr, grad_scale);
    });
    return;
  }
  for_each_piece([&](const Piece& pc) {
    Tensor w = pc.of(master, range_.begin), h = pc.of(working, range_.begin);
    update_master(pc, w, h, pc.of(grads, range_.begin), lr, grad_scale);
  });
}

template <class F>
void Optimizer::for_each_widened(const Tensor& grads, F&& f) {
  MEMFIT_CHECK(widen_.defined() && widen_.dtype() == DType::f32, name(),
               "bf16 gradients need a widening buffer (set_grad_widen)");
  for_each_piece([&](const Piece& pc) {
    grad_widen_chunks(*this, pc.begin, pc.end, [&](int64_t a, int64_t b) {
      MEMFIT_CHECK(b - a <= widen_.numel(), name(),
                   "a chunk of {} bf16 gradients for a widening buffer of {}", b - a,
                   widen_.numel());
      const Piece chunk{pc.param, pc.index, a, b};
      Tensor g = widen_.view(0, {b - a});
      kernels::convert(g, chunk.of(grads, range_.begin));
      f(chunk, g);
    });
  });
}

int64_t grad_widen_elements(const Optimizer& opt) {
  int64_t most = 0;
  for (const ParamInfo& p : opt.layout().params())
    grad_widen_chunks(opt, p.offset, p.offset + p.numel,
                      [&](int64_t a, int64_t b) { most = std::max(most, b - a); });
  return most;
}

int64_t grad_widen_elements(const OptimConfig& config, const ParamLayout& layout) {
  return grad_widen_elements(*make_optimizer(config, layout, nullptr));
}

void Optimizer::update_master(const Piece& piece, Tensor& w, Tensor& working, const Tensor& g,
                              float lr, float grad_scale) {
  update(piece, w, g, lr, grad_scale);
  kernels::convert(working, w);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config, const ParamLayout& layout,
                                          MemoryPool* pool, std::optional<ElementRange> range) {
  check_optim_config(config);
  const std::string& n = config.name;
  if (n == "adamw") return std::make_unique<AdamW>(config, layout, pool, range);
  if (n == "adamw8bit") return std::make_unique<AdamW8bit>(config, layout, pool, range);
  if (n == "adamw4bit") return std::make_unique<AdamW4bit>(config, layout, pool, range);
  if (n == "lion") return std::make_unique<Lion>(config, layout, pool, range);
  if (n == "lion8bit") return std::make_unique<Lion8bit>(config, layout, pool, range);
  if (n == "adam-mini") return std::make_unique<AdamMini>(config, layout, pool, range);
  if (is_apollo(n)) return std::make_unique<Apollo>(config, layout, pool, range);
  if (is_galore(n)) return std::make_unique<Galore>(config, layout, pool, range);
  if (n == "sgd") return std::make_unique<Sgd>(config, layout, pool, range);
  MEMFIT_THROW(ConfigError, "optim", "optimizer '{}' is known but not constructed here", n);
}

size_t optimizer_state_bytes(const OptimConfig& config, const ParamLayout& layout,
                             std::optional<ElementRange> range) {
  return make_optimizer(config, layout, nullptr, range)->state_bytes();
}

size_t optimizer_scratch_bytes(const OptimConfig& config, const ParamLayout& layout) {
  return make_optimizer(config, layout, nullptr)->scratch_bytes();
}

double optimizer_update_flops(const OptimConfig& config, const ParamLayout& layout,
                              std::optional<ElementRange> range) {
  return make_optimizer(config, layout, nullptr, range)->update_flops();
}

}  // namespace memfit
