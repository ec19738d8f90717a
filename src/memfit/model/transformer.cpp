#include "memfit/model/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"

namespace memfit {

using namespace kernels;

Transformer::Transformer(const ModelConfig& config, MemoryPool& pool,
                         const PrecisionOptions& precision,
                         std::optional<ElementRange> master_range, bool master_in_ram,
                         const ParamSharding* sharding,
                         const ParamOffload* param_file)
    : config_(config), pool_(pool), layout_((config_.finalize(), config_)), precision_(precision) {
  check_precision_options(precision);
  const Precision p = precision.precision;
  master_range_ = master_range.value_or(ElementRange{0, layout_.total()});
  const ElementRange whole{0, layout_.total()};
  MEMFIT_CHECK(whole.contains(master_range_), "model",
               "master range [{}, {}) outside the layout of {} elements", master_range_.begin,
               master_range_.end, layout_.total());
  sharded_ = sharding != nullptr;
  if (sharded_) {
    MEMFIT_CHECK(sharding->comm != nullptr && master_range.has_value() &&
                     sharding->shards.at(static_cast<size_t>(sharding->comm->rank())) ==
                         master_range_,
                 "model", "stage 3's working weights are the rank's shard, its master range");
  }
  MEMFIT_CHECK(!param_file || (!master_in_ram && (sharded_ || !master_range)), "model",
               "offloaded working weights need the master weights elsewhere, and one process or "
               "ZeRO stage 3");
  // Stage 3: the working weights of this rank's shard alone (Note [ZeRO stage 3]); offloaded,
  // none (the file source holds the persistent units, and at stage 3 the shard is in the file).
  if (!param_file)
    params_ = Tensor::empty(pool, {sharded_ ? master_range_.size() : layout_.total()},
                            half_dtype(p), Category::params, "params");
  if (p != Precision::fp32 && precision.master_weights && master_in_ram)
    master_ = Tensor::empty(pool, {master_range_.size()}, DType::f32, Category::master, "master");
  grads_ = Tensor::empty(pool, {layout_.total()}, DType::f32, Category::grads, "grads");
  if (sharded_)
    gather_ = std::make_unique<WeightGather>(pool, layout_, params_, *sharding,
                                             param_file ? param_file->file : nullptr,
                                             half_dtype(p));
  else if (param_file)
    gather_ = std::make_unique<WeightGather>(pool, layout_, half_dtype(p), *param_file->file,
                                             param_file->prefetch_depth,
                                             param_file->persist_threshold);
  else
    weights_ = layout_.views(params_);
  grad_views_ = layout_.views(grads_);
}

Tensor Transformer::param(const std::string& name) const {
  MEMFIT_CHECK(!sharded_, "model", "param('{}'): the working weights are a ZeRO-3 shard", name);
  MEMFIT_CHECK(!params_offloaded(), "model", "param('{}'): the working weights are on disk",
               name);
  return layout_.view(params_, name);
}

void Transformer::working_changed() {
  if (gather_) gather_->refresh();
}

void Transformer::refresh_working() {
  if (!master_.defined()) {
    working_changed();
    return;
  }
  if (whole_weights() || sharded_) {
    if (params_.numel() > 0) convert(params_, master_);
  } else if (!master_range_.empty()) {
    Tensor working = params_.view(master_range_.begin, {master_range_.size()});
    convert(working, master_);
  }
  working_changed();
}

void Transformer::working_to(Tensor& out) {
  MEMFIT_CHECK(params_offloaded(), "model", "working_to: the working weights are in RAM");
  gather_->load_all(out);
}

void Transformer::set_weights_from(const Tensor& slab) {
  if (params_offloaded()) {
    // The weights of record are elsewhere (the master file) or the working copy itself: the
    // working copy, rounded, into RAM and the file.
    gather_->store_all(slab);
    working_changed();  // stage 3: every rank regathers at the same point (as below)
    return;
  }
  Tensor& w = weights();
  if (whole_weights()) {
    if (w.raw_data() != slab.raw_data()) convert(w, slab);
  } else {
    // A shard of master weights: its range from the slab; the working copy all of it, rounded
    // as refresh_working rounds the master (the same values, so the same bits).
    if (!master_range_.empty()) {
      convert(w, slab.view(master_range_.begin, {master_range_.size()}));
      if (sharded_ && master_.defined())
        convert(params_, slab.view(master_range_.begin, {master_range_.size()}));
    }
    if (!sharded_) convert(params_, slab);
    working_changed();
    return;
  }
  refresh_working();
}

namespace {

// Writes the family's initial weights (see init_weights) into an f32 slab.
void init_slab(const ModelConfig& config, const ParamLayout& layout, Tensor& slab,
               uint64_t seed) {
  // Box-Muller over mt19937_64 rather than std::normal_distribution, whose algorithm differs
  // between standard libraries: the same seed gives the same weights everywhere.
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  auto normal = [&] {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
  };
  slab.zero();
  const double residual_scale = config.gpt2() ? 1.0 / std::sqrt(2.0 * config.n_layer) : 1.0;
  for (const ParamInfo& p : layout.params()) {
    float* w = slab.data<float>() + p.offset;
    switch (p.role) {
      case ParamRole::norm_weight: std::fill(w, w + p.numel, 1.0f); break;
      case ParamRole::norm_bias:
      case ParamRole::linear_bias: break;
      default: {
        double std = 0.02;
        if (p.role == ParamRole::attn_proj_weight || p.role == ParamRole::mlp_proj_weight)
          std *= residual_scale;
        int64_t n = p.numel;
        if (p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head)
          n = int64_t{config.vocab_size} * p.shape[1];
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(std * normal());
      }
    }
  }
}

}  // namespace

void Transformer::draw_initial_weights(uint64_t seed, Tensor& f32_slab) const {
  MEMFIT_CHECK(f32_slab.dtype() == DType::f32 && f32_slab.numel() == layout_.total(), "model",
               "initial weights go into an f32 slab of {} elements", layout_.total());
  init_slab(config_, layout_, f32_slab, seed);
}

void Transformer::init_weights(uint64_t seed) {
  if (params_offloaded()) {
    // In f32 in the gradient slab (unused until the first backward), then into RAM and the
    // file, rounded as the other paths round.
    init_slab(config_, layout_, grads_, seed);
    gather_->store_all(grads_);
    grads_.zero();
    working_changed();
    return;
  }
  Tensor& w = weights();
  if (w.dtype() == DType::f32 && whole_weights()) {
    init_slab(config_, layout_, w, seed);
  } else if (!whole_weights()) {
    // A shard of master weights (ZeRO): draw the whole layout in f32 into the gradient slab,
    // unused until the first backward, so no byte is added; the shard and the working copy
    // from it.
    init_slab(config_, layout_, grads_, seed);
    set_weights_from(grads_);
    grads_.zero();
    return;
  } else {
    // Pure bf16: draw in f32 in a staging slab that lives only for this call.
    Tensor staging =
        Tensor::empty(pool_, {layout_.total()}, DType::f32, Category::staging, "init.staging");
    init_slab(config_, layout_, staging, seed);
    convert(w, staging);
  }
  refresh_working();
}

void Transformer::reserve(int B, int T, const ActivationOptions& options_in) {
  ActivationOptions options = options_in;
  options.precision = precision_.precision;
  MEMFIT_CHECK_SHAPE(B > 0 && T > 0 && T <= config_.max_seq_len, "model",
                     "batch {} x {} tokens does not fit a context of {}", B, T,
                     config_.max_seq_len);
  if (B == B_ && T == T_ && ctx_.running()) {
    const ActivationOptions& now = ctx_.plan().options;
    if (options.lm_head_chunk == now.lm_head_chunk &&
        options.attention == now.attention && options.ckpt == now.ckpt &&
        options.act_compress == now.act_compress)
      return;
  }
  reserve(plan_step(config_, B, T, options));
}

void Transformer::reserve(StepPlan plan) {
  MEMFIT_CHECK(plan.options.precision == precision_.precision && plan.B > 0 && plan.T > 0 &&
                   plan.T <= config_.max_seq_len,
               "model", "a step plan for {} x {} tokens in {} does not fit this {} model", plan.B,
               plan.T, precision_name(plan.options.precision),
               precision_name(precision_.precision));
  // The old arenas go first, so reserving again never holds two plans at once.
  ctx_ = StepContext();
  step_.reset();
  B_ = T_ = 0;
  std::array<Tensor, kNumCategories> arenas;
  for (Category c : {Category::activations, Category::workspace}) {
    const size_t bytes = plan.arena[static_cast<size_t>(c)];
    if (bytes == 0) continue;
    arenas[static_cast<size_t>(c)] =
        Tensor::empty(pool_, {static_cast<int64_t>(bytes)}, DType::i8, c, arena_tag(c));
  }
  std::vector<Tensor> views;
  for (const BufferSpec& b : plan.buffers)
    views.push_back(
        arenas[static_cast<size_t>(b.category)].view_bytes(b.offset, b.shape, b.dtype));
  B_ = plan.B;
  T_ = plan.T;
  step_ = std::make_unique<TransformerStep>(config_, plan.options, plan.B, plan.T);
  ctx_ = StepContext(std::move(plan), std::move(views));
  ctx_.set_poison(poison_);
  ctx_.set_observer(observer_);
  if (gather_) {
    gather_->set_phases(ctx_.plan().phases);
    ctx_.set_enter_hook([this](int phase) { gather_->enter(phase); });
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
  backward_ready_ = false;
  const float loss_sum =
      step_->forward(ctx_, working_views(), grad_views_, &tokens, &targets, training,
                     loss_scale / N);
  backward_ready_ = training;
  return loss_sum / N;
}

void Transformer::backward() { backward(nullptr); }

void Transformer::backward(const std::function<void(int64_t final_from)>& final_from) {
  MEMFIT_CHECK(backward_ready_, "model", "backward() without a training forward() before it");
  backward_ready_ = false;
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
  if (std::string s = scan(params_, params_range(), "weight"); !s.empty()) return s;
  const std::vector<Tensor>& views = ctx_.views();
  for (size_t i = 0; i < views.size(); ++i) {
    const std::string& tag = ctx_.plan().buffers[i].tag;
    const Tensor& t = views[i];
    // Scratch, recomputation slots and buffers whose bytes another buffer reuses may hold
    // stale data from another block or buffer; token ids and compressed activations' codes are
    // not floats (their scales are, and a non-finite block has a NaN scale).
    if (t.dtype() == DType::i32 || t.dtype() == DType::i8 || t.dtype() == DType::u8 ||
        tag.starts_with("ws.") || tag.starts_with("rc.") ||
        ctx_.plan().shares_bytes(i))
      continue;
    if (!all_finite(t)) return fmt::format("{} (activation)", tag);
  }
  // The backward writes the gradients from the last layer to the embeddings.
  const auto& ps = layout_.params();
  for (auto it = ps.rbegin(); it != ps.rend(); ++it)
    if (!all_finite(grads_.view(it->offset, {it->numel})))
      return fmt::format("{} (gradient)", it->name);
  return {};
}

}  // namespace memfit
