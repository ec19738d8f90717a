// Adam-mini: the transformer partition (Note [Adam-mini partition]) and the step over it.
#include "memfit/optim/adam_mini.h"

#include <algorithm>
#include <span>
#include <vector>

#include "memfit/kernels/cpu/adam_mini.h"

namespace memfit {

namespace {
constexpr int64_t kF32Align = 16;  // floats per 64 bytes
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

std::vector<AdamMiniSegment> AdamMini::partition(const ParamLayout& layout, int n_head) {
  MEMFIT_CHECK(n_head >= 1, "adam-mini", "n_head must be positive, got {}", n_head);
  std::vector<AdamMiniSegment> segs;
  int64_t v = 0;
  auto add = [&](int index, int64_t offset, int64_t numel, int64_t block_len) {
    segs.push_back({index, offset, numel, block_len, v});
    v += numel / block_len;
  };
  const auto& params = layout.params();
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const ParamInfo& p = params[i];
    switch (p.role) {
      case ParamRole::attn_qkv_weight: {
        // (3C, C), or a tensor-parallel rank's (3 R, C): its R = C / tp rows of each of q, k
        // and v (whole heads).
        if (p.shape.rank() != 2 || p.shape[0] % 3 != 0 || p.shape[0] > 3 * p.shape[1])
          MEMFIT_THROW(ShapeError, "adam-mini",
                       "{}: qkv weight must be (3C, C) (or a rank's whole heads of each), got {}",
                       p.name, p.shape);
        const int64_t C = p.shape[1];
        if (C % n_head != 0)
          MEMFIT_THROW(ConfigError, "adam-mini",
                       "n_head {} does not divide the width {} of {}; set OptimConfig::n_head to "
                       "the model's head count",
                       n_head, C, p.name);
        const int64_t hs = C / n_head, R = p.shape[0] / 3;
        if (R % hs != 0)
          MEMFIT_THROW(ShapeError, "adam-mini",
                       "{}: qkv weight must be (3C, C) (or a rank's whole heads of each), got {} "
                       "(heads of {} rows)",
                       p.name, p.shape, hs);
        const int64_t head = hs * C;             // hs rows of C
        add(i, p.offset, R * C, head);           // query, per head
        add(i, p.offset + R * C, R * C, head);   // key, per head
        add(i, p.offset + 2 * R * C, R * C, C);  // value, per output neuron
        break;
      }
      case ParamRole::attn_q_weight:
      case ParamRole::attn_k_weight: {
        // LLaMA's separate projections: query and key per head (grouped-query attention's key
        // has fewer heads, of the same size), as the fused GPT-2 matrix's thirds.
        const int64_t C = p.shape[1];
        if (C % n_head != 0)
          MEMFIT_THROW(ConfigError, "adam-mini",
                       "n_head {} does not divide the width {} of {}; set OptimConfig::n_head to "
                       "the model's head count",
                       n_head, C, p.name);
        add(i, p.offset, p.numel, C / n_head * C);
        break;
      }
      case ParamRole::token_embedding:
      case ParamRole::position_embedding:
      case ParamRole::lm_head:
      case ParamRole::attn_v_weight:
      case ParamRole::attn_proj_weight:
      case ParamRole::mlp_fc_weight:
      case ParamRole::mlp_gate_weight:
      case ParamRole::mlp_up_weight:
      case ParamRole::mlp_proj_weight:
        // Embeddings per token, linear weights per output neuron: one row each.
        add(i, p.offset, p.numel, p.shape.rank() == 2 ? p.shape[1] : p.numel);
        break;
      case ParamRole::norm_weight:
      case ParamRole::norm_bias:
        add(i, p.offset, p.numel, p.numel);
        break;
      case ParamRole::linear_bias:
        add(i, p.offset, p.numel, 1);
        break;
    }
  }
  return segs;
}

int64_t AdamMini::num_blocks(const ParamLayout& layout, int n_head) {
  int64_t v = 0;
  for (const AdamMiniSegment& s : partition(layout, n_head)) v += s.numel / s.block_len;
  return v;
}

AdamMini::AdamMini(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
                   std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "adam-mini"), layout, range),
      segments_(partition(layout, config.n_head)),
      v_elements_(round_up(num_blocks(layout, config.n_head), kF32Align)) {
  init_state(pool, "adam-mini");
}

std::vector<StateSpec> AdamMini::whole_state() const {
  return {{"m", DType::f32, layout_.total()}, {"v", DType::f32, v_elements_}};
}

size_t AdamMini::segment_at(int64_t x) const {
  auto it = std::partition_point(segments_.begin(), segments_.end(), [&](const AdamMiniSegment& s) {
    return s.offset + s.numel <= x;
  });
  return static_cast<size_t>(it - segments_.begin());
}

int64_t AdamMini::state_position(size_t i, int64_t x) const {
  if (i == 0) return x;  // m: per element
  const size_t k = segment_at(x);
  if (k == segments_.size()) return v_elements_;
  const AdamMiniSegment& s = segments_[k];
  return s.v_offset + (std::max(x, s.offset) - s.offset + s.block_len - 1) / s.block_len;
}

int64_t AdamMini::next_cut(int64_t x) const {
  const size_t k = segment_at(x);
  if (k == segments_.size()) return layout_.total();
  const AdamMiniSegment& s = segments_[k];
  if (x <= s.offset) return s.offset;
  return std::min(s.offset + s.numel, s.offset + round_up(x - s.offset, s.block_len));
}

void AdamMini::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  const kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                              pc.param.decay ? config_.weight_decay : 0.0f};
  // The piece's parts of the parameter's segments; cuts fall on block boundaries (next_cut).
  for (size_t k = segment_at(pc.begin); k < segments_.size() && segments_[k].offset < pc.end;
       ++k) {
    const AdamMiniSegment& s = segments_[k];
    const int64_t b = std::max(pc.begin, s.offset), e = std::min(pc.end, s.offset + s.numel);
    if (b >= e) continue;
    Tensor pv = w.view(b - pc.begin, {e - b}), gv = g.view(b - pc.begin, {e - b});
    Tensor mv = state_view(0, b, e - b);
    Tensor vv = state_view(1, state_position(1, b), (e - b) / s.block_len);
    if (split_.axis(pc.index) == SliceAxis::columns) {
      // A row-parallel projection: each row's sum of squares over the whole row, summed over
      // the tensor group in rank order (every rank the same bits), then the mean over all its
      // columns (the rank's block_len on each of the group's ranks).
      std::vector<double> sums(static_cast<size_t>((e - b) / s.block_len));
      kernels::adam_mini_block_sums(gv, s.block_len, grad_scale, sums);
      split_.group->all_reduce_sum(std::span<double>(sums));
      kernels::adam_mini_update_from_sums(pv, gv, mv, vv, s.block_len, sums,
                                          s.block_len * split_.group->size(), h, t_,
                                          grad_scale);
      continue;
    }
    kernels::adam_mini_update(pv, gv, mv, vv, s.block_len, h, t_, grad_scale);
  }
}

size_t AdamMini::state_bytes_for(const ParamLayout& layout, int n_head) {
  return MemoryPool::round_up(static_cast<size_t>(layout.total()) * sizeof(float)) +
         static_cast<size_t>(round_up(num_blocks(layout, n_head), kF32Align)) * sizeof(float);
}

}  // namespace memfit
