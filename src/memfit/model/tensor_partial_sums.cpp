// Sums of the partial gradients over the tensor group (tensor_partial_sums.h).
#include "memfit/model/tensor_partial_sums.h"

#include <span>
#include <utility>
#include <vector>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/model/sequence_parallel.h"

namespace memfit {

namespace {

// A part of the summed gradients as f32 values to reduce over the tensor group, written back
// after: the part itself where the sums are f32, else (--grad-dtype bf16) a widened copy,
// rounded back to nearest even by put_back (the sums the data group's reduction left in bf16;
// the tensor group adds them in f32, as a bf16 accumulator adds micro-batches).
class SumsPart {
 public:
  explicit SumsPart(Tensor part) : part_(std::move(part)) {
    if (part_.dtype() == DType::f32) return;
    copy_.resize(static_cast<size_t>(part_.numel()));
    kernels::convert_n(part_.dtype(), DType::f32, copy_.data(), part_.raw_data(), part_.numel());
  }
  std::span<float> floats() {
    if (copy_.empty()) return {part_.data<float>(), static_cast<size_t>(part_.numel())};
    return copy_;
  }
  void put_back() {
    if (!copy_.empty())
      kernels::convert_n(DType::f32, part_.dtype(), part_.raw_data(), copy_.data(),
                         part_.numel());
  }

 private:
  Tensor part_;
  std::vector<float> copy_;
};

Tensor part_of(const Tensor& sums, ElementRange have, ElementRange part) {
  return sums.view(part.begin - have.begin, {part.size()});
}

}  // namespace

void sum_kv_replicas(TensorGroup& group, const ModelConfig& config, const ParamLayout& layout,
                     const Tensor& sums_in, ElementRange have) {
  const int R = config.kv_replicas();
  if (R == 1) return;
  const int T = group.size(), me = group.rank();
  for (const ParamInfo& p : layout.params()) {
    if (p.role != ParamRole::attn_k_weight && p.role != ParamRole::attn_v_weight) continue;
    const ElementRange part = have.intersect({p.offset, p.offset + p.numel});
    if (part.empty()) continue;
    SumsPart sums(part_of(sums_in, have, part));
    float* g = sums.floats().data();
    const size_t n = static_cast<size_t>(part.size());
    std::vector<float> all(n * static_cast<size_t>(T));
    group.all_gather(std::span<const float>(g, n), all);
    const int first = me / R * R;  // the replicas of this rank's head, in rank order
    for (size_t i = 0; i < n; ++i) {
      float s = all[static_cast<size_t>(first) * n + i];
      for (int q = first + 1; q < first + R; ++q) s += all[static_cast<size_t>(q) * n + i];
      g[i] = s;
    }
    sums.put_back();
  }
}

void sum_sequence_partials(TensorGroup& group, const ParamLayout& layout, const Tensor& sums_in,
                           ElementRange have) {
  for (const ParamInfo& p : layout.params()) {
    if (!sequence_partial(p.role)) continue;
    const ElementRange part = have.intersect({p.offset, p.offset + p.numel});
    if (part.empty()) continue;
    SumsPart sums(part_of(sums_in, have, part));
    group.all_reduce_sum(sums.floats());
    sums.put_back();
  }
}

}  // namespace memfit
