// How a rank's parameters are cut, and the optimizers that take the tensor group; see
// tensor_split.h.
#include "memfit/optim/tensor_split.h"

#include "memfit/model/tensor_slices.h"
#include "memfit/optim/adam_mini.h"
#include "memfit/optim/adamw4bit.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

std::vector<SliceAxis> slice_axes(const ModelConfig& config) {
  const ParamLayout mine(config), whole(whole_model(config));
  std::vector<SliceAxis> axes;
  axes.reserve(mine.params().size());
  for (size_t i = 0; i < mine.params().size(); ++i) {
    const Shape &a = mine.params()[i].shape, &b = whole.params()[i].shape;
    axes.push_back(a == b ? SliceAxis::whole
                   : a[0] != b[0] ? SliceAxis::rows
                                  : SliceAxis::columns);
  }
  return axes;
}

bool takes_tensor_split(const std::string& optim) {
  return optim == "adam-mini" || optim == "adamw4bit";
}

void set_tensor_split(Optimizer& opt, TensorSplit split) {
  if (auto* mini = dynamic_cast<AdamMini*>(&opt))
    mini->set_tensor_split(std::move(split));
  else if (auto* four = dynamic_cast<AdamW4bit*>(&opt))
    four->set_tensor_split(std::move(split));
}

int64_t tensor_split_gathered_bytes(const OptimConfig& optim, const ModelConfig& config,
                                    ElementRange range) {
  if (config.tp <= 1 || !takes_tensor_split(optim.name)) return 0;
  const std::vector<SliceAxis> axes = slice_axes(config);
  const ParamLayout layout(config);
  int64_t bytes = 0;
  if (optim.name == "adam-mini") {
    for (const AdamMiniSegment& s : AdamMini::partition(layout, optim.n_head)) {
      if (axes[static_cast<size_t>(s.param_index)] != SliceAxis::columns) continue;
      const int64_t n = range.intersect({s.offset, s.offset + s.numel}).size();
      bytes += n / s.block_len * int64_t{sizeof(double)};  // the range cuts between rows
    }
    return bytes;
  }
  const QuantizedStateLayout v(layout, AdamW4bit::second_moment_format());
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    if (!v.slot(i).rank1 || axes[i] == SliceAxis::whole ||
        range.intersect({p.offset, p.offset + p.numel}).size() == 0)
      continue;  // a range holds a rank-1 matrix whole or not at all
    bytes += (axes[i] == SliceAxis::rows ? p.shape[1] : p.shape[0]) * int64_t{sizeof(float)};
  }
  return bytes;
}

}  // namespace memfit
