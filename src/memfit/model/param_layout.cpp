#include "memfit/model/param_layout.h"

#include <fmt/format.h>

#include "memfit/model/gpt2_config.h"

namespace memfit {

namespace {
constexpr int64_t kAlignElements = 16;
}

ParamLayout::ParamLayout(const GPT2Config& c) {
  const int64_t C = c.d_model;
  auto add = [&](std::string name, Shape shape, int layer, ParamRole role, bool decay) {
    int64_t numel = shape.numel();
    params_.push_back({std::move(name), shape, total_, numel, layer, role, decay});
    total_ += (numel + kAlignElements - 1) / kAlignElements * kAlignElements;
  };
  add("wte.weight", {c.padded_vocab, C}, -1, ParamRole::token_embedding, true);
  add("wpe.weight", {c.max_seq_len, C}, -1, ParamRole::position_embedding, true);
  for (int l = 0; l < c.n_layer; ++l) {
    auto n = [l](const char* rest) { return fmt::format("h.{}.{}", l, rest); };
    add(n("ln_1.weight"), {C}, l, ParamRole::norm_weight, false);
    add(n("ln_1.bias"), {C}, l, ParamRole::norm_bias, false);
    add(n("attn.c_attn.weight"), {3 * C, C}, l, ParamRole::attn_qkv_weight, true);
    add(n("attn.c_attn.bias"), {3 * C}, l, ParamRole::linear_bias, false);
    add(n("attn.c_proj.weight"), {C, C}, l, ParamRole::attn_proj_weight, true);
    add(n("attn.c_proj.bias"), {C}, l, ParamRole::linear_bias, false);
    add(n("ln_2.weight"), {C}, l, ParamRole::norm_weight, false);
    add(n("ln_2.bias"), {C}, l, ParamRole::norm_bias, false);
    add(n("mlp.c_fc.weight"), {4 * C, C}, l, ParamRole::mlp_fc_weight, true);
    add(n("mlp.c_fc.bias"), {4 * C}, l, ParamRole::linear_bias, false);
    add(n("mlp.c_proj.weight"), {C, 4 * C}, l, ParamRole::mlp_proj_weight, true);
    add(n("mlp.c_proj.bias"), {C}, l, ParamRole::linear_bias, false);
  }
  add("ln_f.weight", {C}, -1, ParamRole::norm_weight, false);
  add("ln_f.bias", {C}, -1, ParamRole::norm_bias, false);
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return p;
  MEMFIT_THROW(Error, "params", "no parameter named '{}'", name);
}

Tensor ParamLayout::view(const Tensor& slab, const ParamInfo& p) const {
  MEMFIT_CHECK_SHAPE(slab.numel() == total_, "params", "slab of {} elements for a layout of {}",
                     slab.numel(), total_);
  return slab.view(p.offset, p.shape);
}

}  // namespace memfit
