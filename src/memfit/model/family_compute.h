// What the step runs for each family: its block and its final norm, behind family_compute(), a
// switch over Family with no default. Apart from model/model_family.h (names, shapes, what
// config code asks), so code that only reads configs links no kernels. Note [Model families]
// in docs/notes/model-families.md.
#pragma once

#include <cstdint>
#include <string>

#include "memfit/model/model_config.h"

namespace memfit {

class BlockStep;
class StepContext;
class Tensor;
struct ModelWeights;

struct FamilyCompute {
  // The block: forward writes its saved activations and output from its input (run again as
  // recomputation); backward accumulates (+=) its parameter gradients into s.g and turns
  // ws.dresidual, the gradient of its output, into that of its input, in place.
  void (*block_forward)(BlockStep& s);
  void (*block_backward)(BlockStep& s);
  // The final norm of x (the top block's output, n rows): forward declares its statistics under
  // `tag` (".mean", ".rstd", as the family keeps them) and, while ctx runs, writes out; backward
  // reads them and, while ctx runs, sets dx (zeroed first) and accumulates g's norm weights.
  void (*final_norm_forward)(StepContext& ctx, const ModelConfig& c, const std::string& tag,
                             int64_t n, const Tensor& x, const Tensor& out, const ModelWeights& w);
  void (*final_norm_backward)(StepContext& ctx, const std::string& tag, const Tensor& dx,
                              const Tensor& dout, const Tensor& x, const ModelWeights& w,
                              const ModelWeights& g);
};

const FamilyCompute& family_compute(Family family);

// Each family's, defined beside its block (model/<family>/<family>_compute.cpp).
const FamilyCompute& gpt2_compute();
const FamilyCompute& llama_compute();

}  // namespace memfit
