// GaLore's step (galore.h): the moments' layout (r x max(m, n) values per projected matrix), the
// projector's, the cuts they allow, and the update of one projected matrix; the other
// parameters go through AdamW's kernel (galore) or AdamW8bit's (galore8bit).
#include "memfit/optim/galore.h"

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/optim/apollo.h"
#include "memfit/optim/galore_projector.h"

namespace memfit {

namespace {
constexpr int64_t kF32Align = 16;  // floats per 64 bytes
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
// Below this many elements a loop stays on the calling thread.
constexpr int64_t kTeamElements = int64_t{1} << 16;
using Part = QuantizedStateLayout::Part;
}  // namespace

bool Galore::projects(const ParamInfo& p) { return Apollo::projects(p); }

int64_t Galore::rank_for(const OptimConfig& config, const ParamInfo& p) {
  return std::min<int64_t>(galore_rank(config), std::min(p.shape[0], p.shape[1]));
}

Galore::Galore(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
               std::optional<ElementRange> range)
    : Optimizer(config, layout, range) {
  check_optim_config(config);
  MEMFIT_CHECK(is_galore(config.name), "galore", "Galore made for optimizer '{}'", config.name);
  const bool q8 = config.name == "galore8bit";
  std::vector<ParamInfo> moments;
  int64_t at = 0, proj = 0;
  for (const ParamInfo& p : layout.params()) {
    ParamInfo q = p;
    q.offset = at = round_up(at, kF32Align);
    proj_at_.push_back(proj);
    if (projects(p)) {
      const int64_t r = rank_for(config_, p);
      const int64_t small = std::min(p.shape[0], p.shape[1]);
      const int64_t large = std::max(p.shape[0], p.shape[1]);
      q.numel = r * large;
      q.shape = Shape{r, large};
      proj += round_up(r * small, kF32Align);
      // R, the projected gradient; galore8bit also the zero weights its kernel steps (D).
      scratch_ = std::max(scratch_, round_up(q.numel, kF32Align) * (q8 ? 2 : 1));
    }
    at += q.numel;
    moments.push_back(std::move(q));
  }
  moments_ = std::make_unique<ParamLayout>(std::move(moments), round_up(at, kF32Align));
  proj_total_ = proj;
  if (q8) {
    quant_ = std::make_unique<QuantizedStateLayout>(*moments_);
    m_ = quant_->append_specs("m", specs_, parts_);
    v_ = quant_->append_specs("v", specs_, parts_);
  } else {
    specs_ = {{"m", DType::f32, moments_->total()}, {"v", DType::f32, moments_->total()}};
  }
  proj_index_ = specs_.size();
  specs_.push_back({"proj", DType::f32, proj_total_});
  init_state(pool, config.name);
}

double Galore::update_flops() const {
  double flops = 0;
  for (const ParamInfo& p : layout_.params())
    if (projects(p) && p.offset >= range_.begin && p.offset + p.numel <= range_.end)
      flops += 4.0 * double(rank_for(config_, p)) * double(p.numel) +
               galore_svd_flops(p.shape[0], p.shape[1]) / double(config_.proj_gap);
  return flops;
}

int64_t Galore::moment_x(int64_t x) const {
  const size_t k = param_at(x);
  if (k == layout_.params().size()) return moments_->total();
  const ParamInfo& p = layout_.params()[k];
  const ParamInfo& q = moments_->params()[k];
  if (x <= p.offset) return q.offset;
  return q.offset + (projects(p) ? q.numel : x - p.offset);
}

int64_t Galore::state_position(size_t i, int64_t x) const {
  if (i == proj_index_) {
    const size_t k = param_at(x);
    if (k == layout_.params().size()) return proj_total_;
    const ParamInfo& p = layout_.params()[k];
    if (x <= p.offset || !projects(p)) return proj_at_[k];
    return proj_at_[k] + round_up(rank_for(config_, p) * std::min(p.shape[0], p.shape[1]),
                                  kF32Align);
  }
  const int64_t y = moment_x(x);
  return eight_bit() ? quant_->position(parts_[i], y) : y;
}

int64_t Galore::next_cut(int64_t x) const {
  const auto& ps = layout_.params();
  // A cut in the padding before parameter k (or the layout's end): a multiple of 16, at most
  // that parameter's start.
  auto padded = [&](int64_t y, size_t k) {
    return std::min(k < ps.size() ? ps[k].offset : layout_.total(), Optimizer::next_cut(y));
  };
  const size_t k = param_at(x);
  if (k == ps.size() || x <= ps[k].offset) return padded(x, k);
  const ParamInfo& p = ps[k];
  const int64_t end = p.offset + p.numel;
  if (projects(p)) return padded(end, k + 1);  // a projected matrix is cut only whole
  int64_t y = Optimizer::next_cut(x);
  if (eight_bit()) {
    const ParamInfo& q = moments_->params()[k];
    y = p.offset + (quant_->next_cut(q.offset + (x - p.offset)) - q.offset);
  }
  return y >= end ? padded(end, k + 1) : y;
}

void Galore::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  MEMFIT_CHECK(w.dtype() == DType::f32, config_.name,
               "{} updates f32 weights (master weights or fp32), got {}", config_.name,
               dtype_name(w.dtype()));
  if (!projects(pc.param)) {
    update_plain(pc, w, g, lr, grad_scale);
    return;
  }
  MEMFIT_CHECK(pc.begin == pc.param.offset && pc.end == pc.param.offset + pc.param.numel,
               config_.name, "{}: a projected matrix is updated whole, got [{}, {}) of it",
               pc.param.name, pc.begin - pc.param.offset, pc.end - pc.param.offset);
  update_matrix(pc, w, g.data<float>(), lr, grad_scale);
}

// A parameter GaLore does not project: AdamW (galore) or 8-bit AdamW (galore8bit) on its own
// moments, as the authors' optimizers step their regular parameter group.
void Galore::update_plain(const Piece& pc, Tensor& w, const Tensor& g, float lr,
                          float grad_scale) {
  const kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                              pc.param.decay ? config_.weight_decay : 0.0f};
  const int64_t n = pc.numel(), at = moment_x(pc.begin);
  if (!eight_bit()) {
    Tensor m = state_view(0, at, n), v = state_view(1, at, n);
    kernels::adamw_update(w, g, m, v, h, t_, grad_scale);
    return;
  }
  auto part = [&](int index, Part p, int64_t count) {
    return state_view(static_cast<size_t>(index), quant_->position(p, at), count);
  };
  if (quant_->slot(pc.index).quantized) {
    const int64_t blocks = kernels::quant_blocks(n);
    Tensor mq = part(m_.codes, Part::codes, n), ma = part(m_.absmax, Part::absmax, blocks);
    Tensor vq = part(v_.codes, Part::codes, n), va = part(v_.absmax, Part::absmax, blocks);
    kernels::adamw8bit_update(w, g, mq, ma, vq, va, h, t_, grad_scale);
  } else {
    Tensor m = part(m_.f32, Part::f32, n), v = part(v_.f32, Part::f32, n);
    kernels::adamw8bit_update_f32(w, g, m, v, h, t_, grad_scale);
  }
}

void Galore::adam_projected(const Piece& pc, float* R, float* D, int64_t n, float lr) {
  const int64_t at = moment_x(pc.begin);
  if (!eight_bit()) {
    // galore_torch/adamw.py: m, v of R; the step lr sqrt(1 - b2^t) / (1 - b1^t) on
    // m / (sqrt(v) + eps), the moments not corrected themselves.
    float* M = state_view(0, at, n).data<float>();
    float* V = state_view(1, at, n).data<float>();
    const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
    const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t_));
    const float step = static_cast<float>(lr * std::sqrt(bc2) / bc1);
#pragma omp parallel for schedule(static) if (n >= kTeamElements)
    for (int64_t e = 0; e < n; ++e) {
      const float r = R[e];
      M[e] = b1 * M[e] + (1.0f - b1) * r;
      V[e] = b2 * V[e] + (1.0f - b2) * r * r;
      R[e] = -step * (M[e] / (std::sqrt(V[e]) + eps));
    }
    return;
  }
  // galore_torch/adamw8bit.py: bitsandbytes' 8-bit AdamW steps weights of zeros with the
  // projected gradient (no decay), and the result is the update projected back.
  std::fill(D, D + n, 0.0f);
  Tensor d = scratch().view(D - scratch().data<float>(), {n});
  const Tensor r = scratch().view(R - scratch().data<float>(), {n});
  const kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps, 0.0f};
  auto part = [&](int index, Part p, int64_t count) {
    return state_view(static_cast<size_t>(index), quant_->position(p, at), count);
  };
  if (quant_->slot(pc.index).quantized) {
    const int64_t blocks = kernels::quant_blocks(n);
    Tensor mq = part(m_.codes, Part::codes, n), ma = part(m_.absmax, Part::absmax, blocks);
    Tensor vq = part(v_.codes, Part::codes, n), va = part(v_.absmax, Part::absmax, blocks);
    kernels::adamw8bit_update(d, r, mq, ma, vq, va, h, t_, 1.0f);
  } else {
    Tensor m = part(m_.f32, Part::f32, n), v = part(v_.f32, Part::f32, n);
    kernels::adamw8bit_update_f32(d, r, m, v, h, t_, 1.0f);
  }
}

// One projected matrix G (m x n, row-major, times grad_scale), as galore_torch's GaLoreProjector
// with proj_type "std": m >= n projects the columns (P r x n, R = G P^T), m < n the rows (P m x r,
// R = P^T G); a new P from G's SVD at steps 1, T + 1, 2T + 1, ...
void Galore::update_matrix(const Piece& pc, Tensor& weights, const float* g, float lr,
                           float grad_scale) {
  const int64_t m = pc.param.shape[0], n = pc.param.shape[1];
  const int64_t small = std::min(m, n), large = std::max(m, n);
  const int64_t r = rank_for(config_, pc.param), numel = r * large;
  const bool columns = galore_projects_columns(m, n);
  float* P = state_view(proj_index_, proj_at_[pc.index], r * small).data<float>();
  if ((t_ - 1) % config_.proj_gap == 0) galore_projector(g, m, n, r, P);
  float* R = scratch().data<float>();
  float* D = R + round_up(numel, kF32Align);
  if (columns)
    kernels::gemm(false, true, m, r, n, grad_scale, g, P, 0.0f, R);
  else
    kernels::gemm(true, false, r, n, m, grad_scale, P, g, 0.0f, R);
  adam_projected(pc, R, D, numel, lr);
  const float* U = eight_bit() ? D : R;  // the step in the projected space
  // W += alpha back(U): U P (m x r times r x n) or P U (m x r times r x n).
  float* w = weights.data<float>();
  if (columns)
    kernels::gemm(false, false, m, n, r, kScale, U, P, 1.0f, w);
  else
    kernels::gemm(false, false, m, n, r, kScale, P, U, 1.0f, w);
  // Decoupled decay after the update, as the authors' code: W -= lr wd W.
  if (pc.param.decay && config_.weight_decay > 0.0f) {
    const float decay = lr * config_.weight_decay;
    const int64_t total = m * n;
#pragma omp parallel for schedule(static) if (total >= kTeamElements)
    for (int64_t e = 0; e < total; ++e) w[e] = w[e] - decay * w[e];
  }
}

}  // namespace memfit
