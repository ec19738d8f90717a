// The tensor group's collectives per step and their price; see tensor_comm.h.
#include "memfit/plan/tensor_comm.h"

#include "memfit/dist/comm_volume.h"
#include "memfit/model/activation_plan.h"

namespace memfit {

TensorCommVolume tensor_comm_per_step(const RunSpec& spec, const StepPlan& step) {
  TensorCommVolume v;
  if (spec.model.tp <= 1) return v;
  const int64_t N = int64_t{spec.batch} * spec.T;
  int64_t reduces = 2;  // the embedding's lookup, the LM head's d(norm)
  for (const Phase& p : step.phases)
    if (p.kind == PhaseKind::forward || p.kind == PhaseKind::recompute ||
        p.kind == PhaseKind::backward)
      reduces += 2;
  const int64_t passes = spec.micro_batch_passes();
  v.all_reduce_count = reduces * passes;
  v.all_reduce_bytes = v.all_reduce_count * N * spec.model.d_model * int64_t{sizeof(float)};
  // Every chunk's statistics: a float and two doubles a row, so the whole batch's rows once.
  v.gathered_bytes = passes * N * int64_t{sizeof(float) + 2 * sizeof(double)} +
                     2 * int64_t{sizeof(double)};
  // Replicated key/value heads (GQA, tp above n_kv_head): their weights' gradients gathered
  // once a step, k and v of every block (Transformer::reduce_kv_replicas).
  if (spec.model.kv_replicas() > 1)
    v.gathered_bytes += int64_t{spec.model.n_layer} * 2 * spec.model.head_size() *
                        spec.model.d_model * int64_t{sizeof(float)};
  return v;
}

double tensor_comm_seconds(const TensorCommVolume& v, int tp, const Calibration& rates) {
  if (tp <= 1) return 0;
  // One all-reduce of all_reduce_each() bytes, as the data group's ring prices it.
  dist::CommVolume one;
  one.all_reduce = v.all_reduce_each();
  const double each = one.copied_bytes(tp) / rates.copy_bytes_per_s +
                      one.summed_bytes(tp) / rates.stream_bytes_per_s;
  // The gathers: each rank's part sent to, and received from, the tp - 1 others.
  dist::CommVolume gathers;
  gathers.all_gather = v.gathered_bytes * tp;
  return double(v.all_reduce_count) * each +
         gathers.copied_bytes(tp) / rates.copy_bytes_per_s;
}

}  // namespace memfit
