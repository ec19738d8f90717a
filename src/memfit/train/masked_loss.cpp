// The step's loss with and without loss masks; see masked_loss.h.
#include "memfit/train/masked_loss.h"

#include <algorithm>

namespace memfit {

StepLoss step_loss_begin(io::DataLoader& data, int64_t micro_batches, int64_t divisor,
                         float loss_scale) {
  StepLoss s;
  if (!data.has_loss_mask()) return s;
  s.masked = true;
  s.targets = data.count_masked(data.position(), micro_batches);
  s.dloss = static_cast<float>(double{loss_scale} * static_cast<double>(divisor) /
                               static_cast<double>(std::max<int64_t>(1, s.targets)));
  return s;
}

float micro_batch_loss(Transformer& gpt, const io::DataLoader& data, const StepLoss& s,
                       bool training, float loss_scale) {
  if (!s.masked) return gpt.forward(data.inputs(), data.targets(), training, loss_scale);
  return gpt.forward_masked(data.inputs(), data.targets(), data.loss_mask(), training, s.dloss);
}

float step_loss_mean(double sum, const StepLoss& s, int64_t micro_batches) {
  if (!s.masked) return static_cast<float>(sum / static_cast<double>(micro_batches));
  return s.targets > 0 ? static_cast<float>(sum / static_cast<double>(s.targets)) : 0.0f;
}

}  // namespace memfit
