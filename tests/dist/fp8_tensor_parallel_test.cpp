// --precision fp8's stored weights under --tp (Note [FP8], "Under --tp and --pp"): the whole
// world as one tensor group (alone a group of one; in CI under `mpirun -n 2` and `-n 4`). Each
// rank builds the whole model (one process) and its slice, both storing the blocks' linears as
// E4M3 codes, from the same master weights, and checks that its codes are exactly the slice of
// the whole model's codes and its scales the whole model's (each matrix's scale from the whole
// matrix's amax, which the group agrees on: fp8_amax_agree): after the set-up (init_weights),
// after the master weights change (refresh_working) with each matrix's largest value on one rank
// alone, and with a NaN on one rank (the whole matrix's scale is NaN, as one process's); the
// set-up of a slice that owns a shard of its master weights (ZeRO 1-2 under --tp:
// fp8_weights_fill) too. GPT-2 (c_attn's q, k and v rows) and LLaMA (over 4 ranks its 2
// key/value heads replicated). No ASSERT before a collective.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/dist/communicator.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/memory/pool.h"
#include "memfit/model/fp8_shard.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/model/transformer.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

ModelConfig tp_model(Family family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.n_head = 8;
  c.n_kv_head = family == Family::llama ? 2 : 0;
  c.d_model = 64;
  c.ffn_dim = family == Family::llama ? 96 : 0;
  c.max_seq_len = 32;
  c.vocab_size = 301;
  c.tie_embeddings = family == Family::gpt2;
  c.finalize();
  return c;
}

ModelState stored(std::optional<ElementRange> master = std::nullopt) {
  ModelState s = ModelState::master_shard(master);
  s.params_fp8 = true;
  return s;
}

// The stored matrix holding layout element e, or null.
const Fp8Matrix* matrix_at(const Fp8WeightLayout& L, int64_t e) {
  for (const Fp8Matrix& m : L.matrices())
    if (e >= m.layout_offset && e < m.layout_offset + m.rows * m.cols) return &m;
  return nullptr;
}

// The slice's scales are the whole model's (bit for bit, NaN as NaN) and each of its codes the
// whole model's code of the same weight; every stored weight of the slice compared.
void expect_slice_of_whole(const Transformer& part, const Transformer& whole,
                           const std::vector<SliceRun>& runs, const std::string& at) {
  const Fp8WeightLayout &P = *part.fp8_weights(), &W = *whole.fp8_weights();
  const float* ps = P.scales(part.fp8_buffer()).data<float>();
  const float* ws = W.scales(whole.fp8_buffer()).data<float>();
  ASSERT_EQ(P.matrices().size(), W.matrices().size()) << at;
  for (size_t i = 0; i < P.matrices().size(); ++i) {
    const Fp8Matrix &p = P.matrices()[i], &w = W.matrices()[i];
    ASSERT_TRUE(p.layer == w.layer && p.slot == w.slot) << at;
    EXPECT_TRUE(std::memcmp(&ps[p.index], &ws[w.index], sizeof(float)) == 0 ||
                (std::isnan(ps[p.index]) && std::isnan(ws[w.index])))
        << at << ": layer " << p.layer << " slot " << int(p.slot) << " scale " << ps[p.index]
        << " against the whole matrix's " << ws[w.index];
  }
  const auto* pc = static_cast<const uint8_t*>(part.fp8_buffer().raw_data());
  const auto* wc = static_cast<const uint8_t*>(whole.fp8_buffer().raw_data());
  int64_t compared = 0, differ = 0;
  for (const SliceRun& r : runs) {
    if (r.whole < 0) continue;
    for (int64_t i = 0; i < r.n; ++i) {
      const Fp8Matrix* p = matrix_at(P, r.local + i);
      if (p == nullptr) continue;
      const Fp8Matrix* w = matrix_at(W, r.whole + i);
      ASSERT_TRUE(w != nullptr && w->layer == p->layer && w->slot == p->slot) << at;
      differ += pc[p->at + static_cast<size_t>(r.local + i - p->layout_offset)] !=
                wc[w->at + static_cast<size_t>(r.whole + i - w->layout_offset)];
      ++compared;
    }
  }
  EXPECT_EQ(compared, P.numel()) << at << ": every stored weight of the slice";
  EXPECT_EQ(differ, 0) << at << ": codes that are not the whole model's";
}

// New master weights, a function of each weight's index in the whole model, written into both:
// values below 0.02, and in every matrix one weight of 1 (six binades above), which lies in one
// rank's slice: a rank that took its own slice's amax would have another scale. `nan_at`: a
// NaN there (a whole-model index).
void set_master(Transformer& part, Transformer& whole, const std::vector<SliceRun>& runs,
                int64_t nan_at = -1) {
  std::vector<float> v(static_cast<size_t>(whole.weights().numel()));
  for (size_t e = 0; e < v.size(); ++e) {
    const uint64_t h = (e + 1) * 0x9E3779B97F4A7C15ull;
    v[e] = static_cast<float>(static_cast<int64_t>(h >> 40) % 2001 - 1000) * 2e-5f;
  }
  for (const Fp8Matrix& m : whole.fp8_weights()->matrices())
    v[static_cast<size_t>(m.layout_offset + (m.index * 7919 + 13) % (m.rows * m.cols))] = 1.0f;
  if (nan_at >= 0) v[static_cast<size_t>(nan_at)] = std::nanf("");
  float* p = part.weights().data<float>();
  for (const SliceRun& r : runs)
    for (int64_t i = 0; r.whole >= 0 && i < r.n; ++i)
      p[r.local + i] = v[static_cast<size_t>(r.whole + i)];
  std::memcpy(whole.weights().data<float>(), v.data(), v.size() * sizeof(float));
  part.refresh_working();
  whole.refresh_working();
}

void check_codes(Family family) {
  const ModelConfig whole_config = tp_model(family);
  ModelConfig config = whole_config;
  config.set_tensor_parallel(world().size());
  CommunicatorTensorGroup group(world());
  MemoryPool pool_whole, pool_tp;
  const PrecisionOptions fp8{Precision::fp8, true};
  Transformer whole(whole_config, pool_whole, fp8, stored());
  Transformer part(config, pool_tp, fp8, stored());
  part.set_tensor_group(group);
  whole.init_weights(7);
  part.init_weights(7);
  const std::vector<SliceRun> runs = tensor_slice_runs(config, group.rank());
  const std::string at = fmt::format("{} rank {} of {}", family_name(family), group.rank(),
                                     group.size());
  expect_slice_of_whole(part, whole, runs, at + ", the set-up");
  set_master(part, whole, runs);
  expect_slice_of_whole(part, whole, runs, at + ", an update");
  // A NaN in the last block's MLP output projection, in the last tensor rank's columns
  // (row-parallel: each row's last columns): only that rank sees it, every rank's scale is NaN.
  const ParamInfo* down = nullptr;
  for (const ParamInfo& p : whole.layout().params())
    if (p.role == ParamRole::mlp_proj_weight) down = &p;
  set_master(part, whole, runs, down->offset + down->shape[1] - 1);
  expect_slice_of_whole(part, whole, runs, at + ", a NaN on the last rank");

  // ZeRO 1-2 under --tp: the slice's master weights a shard (cut inside a matrix), the whole
  // working copy set up from the draw (fp8_weights_fill), the amaxes agreed over the group.
  MemoryPool pool_shard;
  const int64_t n = part.layout().total();
  Transformer shard(config, pool_shard, fp8, stored(ElementRange{n / 3 / 16 * 16, n}));
  shard.set_tensor_group(group);
  shard.init_weights(7, 1000);  // pieces of 1000 elements: each matrix read in several
  whole.init_weights(7);
  expect_slice_of_whole(shard, whole, runs, at + ", a shard's set-up");
}

TEST(Fp8TensorParallel, Gpt2CodesAreTheSliceOfOneProcesss) { check_codes(Family::gpt2); }

TEST(Fp8TensorParallel, LlamaCodesAreTheSliceOfOneProcesss) { check_codes(Family::llama); }

}  // namespace
}  // namespace memfit::dist
