// --precision fp8's stored working weights (model/fp8_weights.h) where each rank owns only a
// shard of the master weights (ZeRO stages 1-2; Note [FP8], "Storage", "Over ranks"). A
// matrix's scale is its whole amax, and a shard may cut a matrix, so the ranks agree on it
// before any encodes: each takes the amax of its part of every matrix (fp8_weights_amax over
// its range: the bf16 copy's, as fp8_weight_scale takes it; 0 for a matrix outside the range),
// the parts' amaxes are combined over the ranks (fp8_amax_combine: the max, which is the whole
// matrix's amax, so the scale is one process's bit for bit), every scale is set from them
// (fp8_weights_set_scales), and each rank writes its range of the working copy
// (fp8_round_compact, fp8_weights_encode_part): the bytes the whole refresh gives there. The
// exchange itself is dist/zero/fp8_publish.h's; the set-up needs none (fp8_weights_fill).
// Under --tp each rank holds a slice of every matrix: the tensor group agrees on the slices'
// amaxes the same way (fp8_amax_agree), at the set-up too.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "memfit/core/element_range.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/fp8_weights.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/tensor_group.h"

namespace memfit {

// Each matrix's amax over layout elements `range` of `master` (f32 from layout element
// `master_begin`, covering the range): fp8_amax_via_bf16 of its part, 0 where they do not meet.
std::vector<float> fp8_weights_amax(const Fp8WeightLayout& layout, const Tensor& master,
                                    int64_t master_begin, ElementRange range);

// max(a, b), NaN if either is NaN (a non-finite master weight makes its matrix's amax NaN in
// one process too).
float fp8_amax_combine(float a, float b);

// --tp: each of `amax` (a slice's amax of each of some matrices, the same matrices in the same
// order on every rank of `group`) made the whole matrix's: every rank's gathered (one float a
// matrix) and combined in rank order with fp8_amax_combine, so NaN if any slice's is, as one
// process's amax of the whole matrix would be; the same bits on every rank.
void fp8_amax_agree(TensorGroup& group, std::span<float> amax);

// One amax per matrix: the buffer's scales, fp8_scale_pow2(amax, e4m3) (fp8_weight_scale's).
void fp8_weights_set_scales(const Fp8WeightLayout& layout, std::span<const float> amax,
                            const Tensor& buffer);

// The codes of every matrix's elements inside `range` (`master` as above), with the scales
// already in the buffer; a matrix may be cut by the range.
void fp8_weights_encode_part(const Fp8WeightLayout& layout, const Tensor& master,
                             int64_t master_begin, ElementRange range, const Tensor& buffer);

// The compact slab's parameters (`compact`: ParamLayout::compact_offsets) over `range`,
// rounded from `master` (as above) into `slab` (the working dtype) as refresh_working rounds
// them; a parameter may be cut by the range.
void fp8_round_compact(const ParamLayout& layout, const std::vector<int64_t>& compact,
                       const Tensor& slab, const Tensor& master, int64_t master_begin,
                       ElementRange range);

// The whole working copy from `fill(from, to, dst)` (f32 values of layout elements [from, to),
// as Transformer::set_weights takes them) through `piece` (f32): the compact slab's parameters
// rounded; each matrix read twice, first for its amax (the max of its pieces'), then encoded
// with the scale of that amax. A set-up needs no exchange of the data group: every rank
// computes the bytes one process holding the whole master weights would. Under --tp `agree`
// makes the slices' amaxes the whole matrices' (Fp8AmaxAgree; empty: each matrix whole).
void fp8_weights_fill(const ParamLayout& layout, const std::vector<int64_t>& compact,
                      const Tensor& slab, const Fp8WeightLayout& fp8, const Tensor& buffer,
                      const std::function<void(int64_t, int64_t, float*)>& fill,
                      const Tensor& piece, const Fp8AmaxAgree& agree = {});

}  // namespace memfit
