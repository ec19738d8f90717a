// APOLLO's step (apollo.h): the layout of its per-matrix state, the cuts it allows, and the
// update of one projected matrix; the other parameters go through AdamW's kernel.
#include "memfit/optim/apollo.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/model/stage_offsets.h"
#include "memfit/optim/apollo_projection.h"

namespace memfit {

namespace {
constexpr int64_t kF32Align = 16;  // floats per 64 bytes
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
// The paper's constants (apollo_torch/apollo.py): the limiter's growth bound and the guard in
// the scaling factor's and the limiter's denominators.
constexpr double kLimiterGamma = 1.01, kGuard = 1e-8;

struct Dims {
  int64_t m, n, small, large, r;
  bool rows() const { return m >= n; }  // channels are rows (m >= n) or columns
};
Dims dims_of(const OptimConfig& c, const ParamInfo& p) {
  const int64_t m = p.shape[0], n = p.shape[1];
  const int64_t small = std::min(m, n), large = std::max(m, n);
  return {m, n, small, large, std::min<int64_t>(apollo_rank(c), small)};
}
// Scratch of one matrix: P (r x small), R (r x large), per-channel sums of R^2 and R~^2 and of
// G^2 (3 x large doubles) and the factors (large floats), each part 64-byte aligned.
struct ScratchParts {
  int64_t p, r, sums, factors, total;
};
ScratchParts scratch_parts(const Dims& d) {
  ScratchParts s{};
  s.p = 0;
  s.r = round_up(d.r * d.small, kF32Align);
  s.sums = s.r + round_up(d.r * d.large, kF32Align);
  s.factors = s.sums + round_up(6 * d.large, kF32Align);
  s.total = s.factors + round_up(d.large, kF32Align);
  return s;
}

// Below this many elements a loop stays on the calling thread (a team costs more than it saves).
constexpr int64_t kTeamElements = int64_t{1} << 16;

// f(i, j0, j1) for row i's columns [j0, j1) of a rows x cols matrix, on the OpenMP team, each
// channel (a row when by_rows, else a column) on one thread and visited in order (columns
// ascending, or rows ascending): per-channel sums come out the same for any thread count.
template <class F>
void over_channels(int64_t rows, int64_t cols, bool by_rows, F&& f) {
  const bool team = rows * cols >= kTeamElements;
  if (by_rows) {
#pragma omp parallel for schedule(static) if (team)
    for (int64_t i = 0; i < rows; ++i) f(i, int64_t{0}, cols);
    return;
  }
  constexpr int64_t kBlock = 64;  // columns a thread owns, one cache line of a row
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (team)
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < rows; ++i) f(i, b * kBlock, std::min(cols, (b + 1) * kBlock));
}
}  // namespace

bool Apollo::projects(const ParamInfo& p) {
  return p.shape.rank() == 2 && is_linear_weight(p.role);
}

int64_t Apollo::rank_for(const OptimConfig& config, const ParamInfo& p) {
  return dims_of(config, p).r;
}

Apollo::Apollo(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
               std::optional<ElementRange> range)
    : Optimizer(config, layout, range) {
  check_optim_config(config);
  MEMFIT_CHECK(is_apollo(config.name), "apollo", "Apollo made for optimizer '{}'", config.name);
  int64_t at = 0, lim = 0;
  for (const ParamInfo& p : layout.params()) {
    at = round_up(at, kF32Align);
    moment_at_.push_back(at);
    limiter_at_.push_back(lim);
    if (projects(p)) {
      const Dims d = dims_of(config_, p);
      moments_.push_back(d.r * d.large);
      scratch_ = std::max(scratch_, scratch_parts(d).total);
      ++lim;
    } else {
      moments_.push_back(p.numel);
    }
    at += moments_.back();
  }
  moment_total_ = round_up(at, kF32Align);
  limiter_total_ = round_up(lim, kF32Align);
  init_state(pool, config.name);
}

double Apollo::update_flops() const {
  double flops = 0;
  for (const ParamInfo& p : layout_.params())
    if (projects(p) && p.offset >= range_.begin && p.offset + p.numel <= range_.end)
      flops += 2.0 * double(rank_for(config_, p)) * double(p.numel);
  return flops;
}

std::vector<StateSpec> Apollo::whole_state() const {
  return {{"m", DType::f32, moment_total_},
          {"v", DType::f32, moment_total_},
          {"limiter", DType::f32, limiter_total_}};
}

int64_t Apollo::state_position(size_t i, int64_t x) const {
  const size_t k = param_at(x);
  if (k == layout_.params().size()) return i == 2 ? limiter_total_ : moment_total_;
  const ParamInfo& p = layout_.params()[k];
  if (i == 2) return limiter_at_[k] + (x > p.offset && projects(p) ? 1 : 0);
  if (x <= p.offset) return moment_at_[k];
  return moment_at_[k] + (projects(p) ? moments_[k] : x - p.offset);
}

int64_t Apollo::next_cut(int64_t x) const {
  const auto& ps = layout_.params();
  int64_t y = Optimizer::next_cut(x);
  for (;;) {
    const size_t k = param_at(y);
    if (k == ps.size() || !projects(ps[k]) || y <= ps[k].offset) return y;
    if (x <= ps[k].offset) return ps[k].offset;  // the matrix's start
    y = Optimizer::next_cut(ps[k].offset + ps[k].numel);
  }
}

void Apollo::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  if (projects(pc.param)) {
    MEMFIT_CHECK(pc.begin == pc.param.offset && pc.end == pc.param.offset + pc.param.numel,
                 config_.name, "{}: a projected matrix is updated whole, got [{}, {}) of it",
                 pc.param.name, pc.begin - pc.param.offset, pc.end - pc.param.offset);
    update_matrix(pc, w, g.data<float>(), lr, grad_scale);
    return;
  }
  const int64_t at = state_position(0, pc.begin);
  Tensor m = state_view(0, at, pc.numel()), v = state_view(1, at, pc.numel());
  const kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                              pc.param.decay ? config_.weight_decay : 0.0f};
  if (w.dtype() == DType::bf16)  // pure bf16: as AdamW rounds
    kernels::adamw_update_stochastic(w, g, m, v, h, t_, grad_scale, config_.seed,
                                     static_cast<uint64_t>(whole_index(layout_, pc.begin)));
  else
    kernels::adamw_update(w, g, m, v, h, t_, grad_scale);
}

// One projected matrix G (m x n, row-major, times grad_scale), as apollo_torch/apollo.py with
// proj_type "std": m >= n projects the columns (R = G P^T, P r x n, channels are rows), m < n
// the rows (R = P^T G, P m x r, channels are columns).
void Apollo::update_matrix(const Piece& pc, Tensor& weights, const float* g, float lr,
                           float grad_scale) {
  const Dims d = dims_of(config_, pc.param);
  const ScratchParts sp = scratch_parts(d);
  float* base = scratch().data<float>();
  float* P = base + sp.p;
  float* R = base + sp.r;
  double* sum_r = reinterpret_cast<double*>(base + sp.sums);  // per channel: sum R^2
  double* sum_n = sum_r + d.large;                            // sum R~^2
  double* sum_g = sum_n + d.large;                            // sum G^2
  float* s = base + sp.factors;
  const int64_t k = state_position(0, pc.begin), numel = d.r * d.large;
  float* M = state_view(0, k, numel).data<float>();
  float* V = state_view(1, k, numel).data<float>();
  float* limit = state_view(2, state_position(2, pc.begin), 1).data<float>();

  // The projection of this window, drawn again (never stored).
  const uint64_t window = static_cast<uint64_t>((t_ - 1) / config_.proj_gap);
  apollo_projection_fill(P, d.r * d.small, apollo_projection_key(config_.seed, index_base_ + pc.index, window),
                         static_cast<int>(d.r));
  if (d.rows())
    kernels::gemm(false, true, d.m, d.r, d.n, grad_scale, g, P, 0.0f, R);
  else
    kernels::gemm(true, false, d.r, d.n, d.m, grad_scale, P, g, 0.0f, R);

  // Adam on R (r x large); per channel the sums of R^2 and of R~^2, R~ = m / (sqrt(v) + eps).
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  std::fill(sum_r, sum_r + 3 * d.large, 0.0);
  const int64_t rows = d.rows() ? d.m : d.r, cols = d.rows() ? d.r : d.n;
  over_channels(rows, cols, d.rows(), [&](int64_t i, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t e = i * cols + j;
      const float r = R[e];
      M[e] = b1 * M[e] + (1.0f - b1) * r;
      V[e] = b2 * V[e] + (1.0f - b2) * r * r;
      const float n = M[e] / (std::sqrt(V[e]) + eps);
      const int64_t c = d.rows() ? i : j;
      sum_r[c] += static_cast<double>(r) * r;
      sum_n[c] += static_cast<double>(n) * n;
    }
  });
  // The scaling factors: per channel (apollo) or one for the tensor (apollo-mini).
  if (config_.name == "apollo") {
    for (int64_t c = 0; c < d.large; ++c)
      s[c] = static_cast<float>(std::sqrt(sum_n[c]) / (std::sqrt(sum_r[c]) + kGuard));
  } else {
    double tr = 0, tn = 0;
    for (int64_t c = 0; c < d.large; ++c) tr += sum_r[c], tn += sum_n[c];
    std::fill(s, s + d.large, static_cast<float>(std::sqrt(tn) / (std::sqrt(tr) + kGuard)));
  }
  // ||G * s||: per channel sums of G^2, then the channels in order.
  over_channels(d.m, d.n, d.rows(), [&](int64_t i, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const float x = grad_scale * g[i * d.n + j] * s[d.rows() ? i : j];
      sum_g[d.rows() ? i : j] += static_cast<double>(x) * x;
    }
  });
  double norm2 = 0;
  for (int64_t c = 0; c < d.large; ++c) norm2 += sum_g[c];
  const double norm = std::sqrt(norm2);
  // The norm-growth limiter (Fira): the scaled gradient's norm grows by at most gamma a step.
  double limiter = 1.0;
  if (t_ > 1) {
    limiter = std::max(norm / (static_cast<double>(*limit) + kGuard), kLimiterGamma) /
              kLimiterGamma;
    *limit = static_cast<float>(norm / limiter);
  } else {
    *limit = static_cast<float>(norm);
  }
  // W -= lr sqrt(1 - b2^t) / (1 - b1^t) * alpha * (G s / limiter); W -= lr wd W.
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t_));
  const float step = static_cast<float>(lr * std::sqrt(bc2) / bc1);
  const float alpha = config_.name == "apollo" ? 1.0f : std::sqrt(128.0f);
  const float inv_limiter = static_cast<float>(1.0 / limiter);
  const float decay = pc.param.decay ? lr * config_.weight_decay : 0.0f;
  auto updated = [&](float w, int64_t i, int64_t j) {
    const float u = grad_scale * g[i * d.n + j] * s[d.rows() ? i : j] * inv_limiter * alpha;
    const float x = w - step * u;
    return x - decay * x;
  };
  if (weights.dtype() == DType::f32) {
    float* w = weights.data<float>();
#pragma omp parallel for schedule(static) if (d.m * d.n >= kTeamElements)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) w[i * d.n + j] = updated(w[i * d.n + j], i, j);
    return;
  }
  // Pure bf16: the f32 result rounded stochastically, element e of the slab drawing its bits
  // from (seed mixed with t, e), as convert_stochastic draws them (e in the whole model: a
  // pipeline stage rounds as one process does).
  uint16_t* w = static_cast<uint16_t*>(weights.raw_data());
  const uint64_t seed = splitmix64(config_.seed ^ splitmix64(static_cast<uint64_t>(t_)));
#pragma omp parallel for schedule(static) if (d.m * d.n >= kTeamElements)
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = 0; j < d.n; ++j) {
      const int64_t e = i * d.n + j;
      const uint32_t bits = static_cast<uint32_t>(w[e]) << 16;
      float x;
      std::memcpy(&x, &bits, 4);
      const uint64_t index = static_cast<uint64_t>(whole_index(layout_, pc.begin) + e);
      const uint32_t random = kernels::sr_bits(
          kernels::sr_key(seed, static_cast<uint32_t>(index >> 32)), static_cast<uint32_t>(index));
      w[e] = kernels::bf16_from_f32_stochastic(updated(x, i, j), random);
    }
  }
}

}  // namespace memfit
