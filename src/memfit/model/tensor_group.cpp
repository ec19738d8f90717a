// The one-process tensor group: a layer whole on one rank, its collectives identities.
#include "memfit/model/tensor_group.h"

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit {
namespace {

class SingleTensorGroup final : public TensorGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(std::span<float>) override {}
  void all_reduce_sum(std::span<double>) override {}
  void all_reduce_max(std::span<float>) override {}
  void all_gather(std::span<const float> in, std::span<float> out) override {
    MEMFIT_CHECK(out.size() == in.size(), "all_gather", "out holds {} floats, in {} (1 rank)",
                 out.size(), in.size());
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }
  void reduce_scatter_sum(std::span<const float> in, std::span<float> out) override {
    MEMFIT_CHECK(out.size() == in.size(), "reduce_scatter_sum",
                 "out holds {} floats, in {} (1 rank)", out.size(), in.size());
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }
};

}  // namespace

std::unique_ptr<TensorGroup> make_single_tensor_group() {
  return std::make_unique<SingleTensorGroup>();
}

}  // namespace memfit
