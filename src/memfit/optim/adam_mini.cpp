// Adam-mini: the transformer partition (Note [Adam-mini partition]) and the step over it.
#include "memfit/optim/adam_mini.h"

#include "memfit/kernels/cpu/adam_mini.h"
#include "memfit/optim/step_checks.h"

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
        const int64_t C = p.shape[1];
        if (p.shape.rank() != 2 || p.shape[0] != 3 * C)
          MEMFIT_THROW(ShapeError, "adam-mini", "{}: qkv weight must be (3C, C), got {}", p.name,
                       p.shape);
        if (C % n_head != 0)
          MEMFIT_THROW(ConfigError, "adam-mini",
                       "n_head {} does not divide the width {} of {}; set OptimConfig::n_head to "
                       "the model's head count",
                       n_head, C, p.name);
        const int64_t head = C / n_head * C;     // hs rows of C
        add(i, p.offset, C * C, head);           // query, per head
        add(i, p.offset + C * C, C * C, head);   // key, per head
        add(i, p.offset + 2 * C * C, C * C, C);  // value, per output neuron
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

AdamMini::AdamMini(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
    : config_(checked_optim_config(config, "adam-mini")),
      layout_(layout),
      segments_(partition(layout, config.n_head)) {
  const int64_t blocks = num_blocks(layout, config.n_head);
  m_ = Tensor::empty(pool, {layout.total()}, DType::f32, Category::optimizer, "adam-mini.m");
  v_ = Tensor::empty(pool, {round_up(blocks, kF32Align)}, DType::f32, Category::optimizer,
                     "adam-mini.v");
}

void AdamMini::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  check_step_args("adam-mini", layout_, params, grads, lr, grad_scale);
  ++t_;
  const auto& infos = layout_.params();
  for (const AdamMiniSegment& s : segments_) {
    const ParamInfo& p = infos[s.param_index];
    kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                          p.decay ? config_.weight_decay : 0.0f};
    Tensor pv = params.view(s.offset, {s.numel});
    Tensor mv = m_.view(s.offset, {s.numel});
    Tensor vv = v_.view(s.v_offset, {s.numel / s.block_len});
    kernels::adam_mini_update(pv, grads.view(s.offset, {s.numel}), mv, vv, s.block_len, h, t_,
                              grad_scale);
  }
}

std::vector<std::pair<std::string, Tensor>> AdamMini::state() { return {{"m", m_}, {"v", v_}}; }

size_t AdamMini::state_bytes() const { return m_.nbytes() + v_.nbytes(); }

size_t AdamMini::state_bytes_for(const ParamLayout& layout, int n_head) {
  return MemoryPool::round_up(static_cast<size_t>(layout.total()) * sizeof(float)) +
         static_cast<size_t>(round_up(num_blocks(layout, n_head), kF32Align)) * sizeof(float);
}

}  // namespace memfit
