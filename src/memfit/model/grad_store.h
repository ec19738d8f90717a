// Where a step's f32 gradients live when they are not one slab in RAM and not reduced over ranks
// (UnitGrads): a store that gives each unit (state/shard.h: the embeddings, each block, the
// tail) a buffer only while its backward runs. The one store today is --offload-grads nvme's
// (offload/offloaded_grads.h: each finished unit written to a file, read back before the next
// micro-batch's backward of it). The Transformer calls it at the points where it calls
// UnitGrads: a new step, a training forward, a block's backward entered, a part finished.
// Note [NVMe offload], "Gradients on disk" (docs/notes/offload.md).
#pragma once

#include <vector>

#include "memfit/model/param_layout.h"

namespace memfit {

// What the update needs of one unit's final gradients (in the slab's order of units, the
// global norm adds them: update.cpp).
struct UnitGradCheck {
  bool finite = true;
  double sum_squares = 0;
};

class GradStore {
 public:
  virtual ~GradStore() = default;
  // The views the step writes: the edge units always, a block once its backward is entered.
  virtual const ModelWeights& views() const = 0;
  // A new step: the next micro-batch is the step's first (its gradients start from zero).
  virtual void zero() = 0;
  // A training forward starts.
  virtual void begin_micro_batch() = 0;
  // Block `layer`'s backward starts.
  virtual void enter_backward(int layer) = 0;
  // The backward finished a part: n_layer the tail, l block l, -1 the embeddings (the last).
  virtual void done(int part) = 0;
  // After the step's last backward: each unit's check of its final gradients (unscaled in
  // place first where the step has a loss scale), in unit order.
  virtual const std::vector<UnitGradCheck>& unit_checks() const = 0;
};

}  // namespace memfit
