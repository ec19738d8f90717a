// The stored FP8 working weights published from their owners at ZeRO stages 1-2
// (fp8_publish.h, Note [FP8], "Storage").
#include "memfit/dist/zero/fp8_publish.h"

#include <cstddef>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/dist/shard_collectives.h"
#include "memfit/model/fp8_shard.h"

namespace memfit {

namespace {

// Every matrix's amax over the ranks: each rank's part amaxes gathered in rank order, combined.
std::vector<float> agreed_amax(dist::Communicator& comm, const std::vector<float>& mine) {
  const size_t W = static_cast<size_t>(comm.size()), n = mine.size();
  std::vector<float> all(W * n);
  comm.all_gather(mine.data(), all.data(), std::vector<int64_t>(W, static_cast<int64_t>(n)),
                  static_cast<int>(sizeof(float)));
  std::vector<float> amax(n, 0.0f);
  for (size_t r = 0; r < W; ++r)
    for (size_t i = 0; i < n; ++i) amax[i] = fp8_amax_combine(amax[i], all[r * n + i]);
  return amax;
}

// `whole` (layout elements [within.begin, within.end), elem bytes each) gets each rank's part of
// it from its owner; this rank's part is already in place (the shards tile the layout in rank
// order, so it starts after the earlier ranks' parts: an in-place gather even where empty).
// Returns the bytes covered.
int64_t gather_within(dist::Communicator& comm, std::span<const ElementRange> shards,
                      ElementRange within, std::byte* whole, size_t elem) {
  const std::vector<int64_t> counts = dist::shard_counts(shards, within);
  int64_t before = 0;
  for (int r = 0; r < comm.rank(); ++r) before += counts[static_cast<size_t>(r)];
  comm.all_gather(whole + static_cast<size_t>(before) * elem, whole, counts,
                  static_cast<int>(elem));
  return within.size() * static_cast<int64_t>(elem);
}

}  // namespace

int64_t publish_fp8_weights(Transformer& gpt, dist::Communicator& comm,
                            std::span<const ElementRange> shards) {
  const Fp8WeightLayout* fp8 = gpt.fp8_weights();
  MEMFIT_CHECK(fp8 != nullptr && shards.size() == static_cast<size_t>(comm.size()), "zero",
               "publishing stored FP8 weights needs them, and one shard per rank ({} for {})",
               shards.size(), comm.size());
  const ElementRange mine = shards[static_cast<size_t>(comm.rank())];
  MEMFIT_CHECK(gpt.has_master() && gpt.master_range() == mine, "zero",
               "rank {}'s master weights [{}, {}) are not its shard [{}, {})", comm.rank(),
               gpt.master_range().begin, gpt.master_range().end, mine.begin, mine.end);
  // The scales agreed, then this rank's range of the working copy from its master weights.
  const Tensor& master = gpt.weights();
  const Tensor& buffer = gpt.fp8_buffer();
  const ParamLayout& layout = gpt.layout();
  const std::vector<int64_t> compact = layout.compact_offsets();
  std::vector<float> amax = agreed_amax(comm, fp8_weights_amax(*fp8, master, mine.begin, mine));
  // --tp: that is the amax of this tensor rank's slice of each matrix; the tensor group's
  // agreement makes it the whole matrix's (Note [FP8], "Under --tp and --pp").
  if (TensorGroup* group = gpt.tensor_group()) fp8_amax_agree(*group, amax);
  fp8_weights_set_scales(*fp8, amax, buffer);
  fp8_round_compact(layout, compact, gpt.params(), master, mine.begin, mine);
  fp8_weights_encode_part(*fp8, master, mine.begin, mine, buffer);
  int64_t bytes = 0;
  // The compact slab, parameter by parameter (each at its compact offset).
  auto* slab = static_cast<std::byte*>(gpt.params().raw_data());
  const size_t es = dtype_size(gpt.params().dtype());
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const int64_t at = compact[i];
    if (at < 0) continue;
    const ParamInfo& p = layout.params()[i];
    bytes += gather_within(comm, shards, {p.offset, p.offset + p.numel},
                           slab + static_cast<size_t>(at) * es, es);
  }
  // The codes, matrix by matrix (a fused matrix's codes follow its layout elements).
  auto* codes = static_cast<std::byte*>(buffer.raw_data());
  for (const Fp8Matrix& m : fp8->matrices())
    bytes += gather_within(comm, shards, {m.layout_offset, m.layout_offset + m.rows * m.cols},
                           codes + m.at, 1);
  return bytes;
}

int64_t fp8_publish_bytes(const ParamLayout& layout, DType working) {
  const Fp8WeightLayout fp8(layout);
  int64_t bytes = fp8.numel();
  const std::vector<int64_t> compact = layout.compact_offsets();
  for (size_t i = 0; i < compact.size(); ++i)
    if (compact[i] >= 0)
      bytes += layout.params()[i].numel * static_cast<int64_t>(dtype_size(working));
  return bytes;
}

}  // namespace memfit
