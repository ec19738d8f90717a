#include "memfit/model/tensor_slices.h"

#include <algorithm>

#include "memfit/core/error.h"
#include "memfit/model/vocab_parallel_crossentropy.h"

namespace memfit {

ModelConfig whole_model(const ModelConfig& config) {
  ModelConfig c = config;
  c.tp = 1;
  return c;
}

namespace {

// `blocks` equal row blocks of the whole parameter (GPT-2's q | k | v: 3; else 1), each split
// over the ranks: the rank's rows of each, side by side in its parameter.
void row_blocks(std::vector<SliceRun>& out, const ParamInfo& lp, const ParamInfo& wp, int blocks,
                int index) {
  const int64_t cols = lp.shape.rank() == 2 ? lp.shape[1] : 1;
  const int64_t whole_rows = wp.shape[0] / blocks, local_rows = lp.shape[0] / blocks;
  for (int b = 0; b < blocks; ++b)
    out.push_back({lp.offset + b * local_rows * cols,
                   wp.offset + (b * whole_rows + int64_t{index} * local_rows) * cols,
                   local_rows * cols});
}

}  // namespace

std::vector<SliceRun> tensor_slice_runs(const ModelConfig& config, int rank) {
  const ModelConfig whole = whole_model(config);
  const ParamLayout local_layout(config), whole_layout(whole);
  const auto &lps = local_layout.params(), &wps = whole_layout.params();
  MEMFIT_CHECK(lps.size() == wps.size() && rank >= 0 && rank < config.tp, "tensor_parallel",
               "rank {} of --tp {}: {} parameters against the whole model's {}", rank, config.tp,
               lps.size(), wps.size());
  std::vector<SliceRun> out;
  for (size_t i = 0; i < lps.size(); ++i) {
    const ParamInfo &lp = lps[i], &wp = wps[i];
    MEMFIT_CHECK(lp.name == wp.name, "tensor_parallel", "parameter {} against {}", lp.name,
                 wp.name);
    if (lp.shape == wp.shape) {  // replicated
      out.push_back({lp.offset, wp.offset, lp.numel});
      continue;
    }
    switch (lp.role) {
      case ParamRole::token_embedding:
      case ParamRole::lm_head: {
        const VocabShard s = vocab_shard(config.vocab_size, config.tp, rank, kVocabPadMultiple);
        const int64_t C = lp.shape[1];
        const int64_t have = std::clamp<int64_t>(wp.shape[0] - s.begin, 0, s.width);
        if (have > 0) out.push_back({lp.offset, wp.offset + s.begin * C, have * C});
        if (have < s.width) out.push_back({lp.offset + have * C, -1, (s.width - have) * C});
        break;
      }
      case ParamRole::attn_proj_weight:
      case ParamRole::mlp_proj_weight: {  // row-parallel: the rank's columns of every row
        const int64_t rows = lp.shape[0], lc = lp.shape[1], wc = wp.shape[1];
        for (int64_t r = 0; r < rows; ++r)
          out.push_back({lp.offset + r * lc, wp.offset + r * wc + int64_t{rank} * lc, lc});
        break;
      }
      case ParamRole::attn_qkv_weight: row_blocks(out, lp, wp, 3, rank); break;
      case ParamRole::attn_k_weight:
      case ParamRole::attn_v_weight:  // a replicated kv head: the one the rank's queries use
        row_blocks(out, lp, wp, 1, rank / config.kv_replicas());
        break;
      case ParamRole::linear_bias:  // split: c_attn's (q | k | v) or c_fc's
        row_blocks(out, lp, wp, lp.name.find("c_attn") != std::string::npos ? 3 : 1, rank);
        break;
      default: row_blocks(out, lp, wp, 1, rank); break;  // column-parallel rows
    }
  }
  return out;
}

}  // namespace memfit
