// StatePlacement (Note [State placement]): at every stage, over 1, 2 and 3 ranks, in RAM and
// offloaded, each kind of state lives where the stage says, the ranks' ranges of a sharded kind
// tile the layout in rank order, a kind held whole is whole on every rank, each rank's bytes
// add up to the whole's, and one rank is stage 0 whatever --zero says.
#include "memfit/state/state_placement.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "memfit/model/model_config.h"
#include "memfit/state/shard.h"

namespace memfit {
namespace {

struct Fixture {
  ModelConfig mc;
  ParamLayout layout;
  OptimConfig oc;
  explicit Fixture(const char* optim = "adamw8bit")
      : mc([] {
          ModelConfig c = ModelConfig::preset("gpt2-tiny");
          c.finalize();
          return c;
        }()),
        layout(mc) {
    oc.name = optim;  // 8-bit state: cuts at blocks of 256 from a parameter's start, uneven
    oc.n_head = mc.n_head;
  }
};

StateOptions options(int zero, bool offload, bool master = true) {
  StateOptions o;
  o.zero = zero;
  o.working_dtype = DType::bf16;
  o.master_weights = master;
  o.offload_optimizer = offload;
  o.offload_params = offload && zero == 3;  // (one process, or stage 3: RunSpec::check)
  o.offload_dir = "/tmp/off";
  o.grad_dtype = DType::f32;
  o.bucket_bytes = 1 << 20;
  return o;
}

// The ranks' ranges of one kind: a shard tiles the layout in rank order; whole is whole.
void expect_tiles_or_whole(const std::vector<StateSlice>& per_rank, const ParamLayout& layout,
                           const std::string& what) {
  const ElementRange whole{0, layout.total()};
  const Residence first = per_rank.front().where;
  // A file holds the whole layout in one process and below stage 1, else the rank's shard.
  const bool tiles = first == Residence::shard ||
                     (first == Residence::file && per_rank.front().range != whole);
  int64_t at = 0;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const StateSlice& s = per_rank[r];
    EXPECT_EQ(s.where, first) << what << " rank " << r;  // every rank alike
    if (s.where == Residence::none) {
      EXPECT_TRUE(s.range.empty()) << what;
    } else if (!tiles) {
      EXPECT_EQ(s.range, whole) << what << " rank " << r;
    } else {
      EXPECT_EQ(s.range.begin, at) << what << " rank " << r;
      at = s.range.end;
    }
  }
  if (tiles) {
    EXPECT_EQ(at, layout.total()) << what;
  }
}

TEST(StatePlacement, EveryStageWorldAndOffloadPlacesEachKindAndTheRangesTile) {
  const Fixture f;
  const ElementRange whole{0, f.layout.total()};
  int checked = 0;
  for (int world : {1, 2, 3})
    for (int zero = 0; zero <= 3; ++zero)
      for (bool offload : {false, true}) {
        const std::string what = fmt::format("W={} --zero {}{}", world, zero,
                                             offload ? " offloaded" : "");
        const StateOptions o = options(zero, offload);
        const StatePlacement p0(f.layout, f.oc, o, {0, world});
        std::vector<StateSlice> params, master, grads, optimizer;
        int64_t owned = 0;
        for (int r = 0; r < world; ++r) {
          const StatePlacement p = p0.of_rank(r);
          const int stage = world > 1 ? zero : 0;
          EXPECT_EQ(p.stage(), stage) << what;
          EXPECT_EQ(p.rank(), r);
          EXPECT_EQ(p.shards(), world > 1 ? shard_ranges(f.layout, f.oc, world)
                                          : std::vector<ElementRange>{whole})
              << what;
          // What each stage shards (Note [ZeRO]).
          EXPECT_EQ(p.owned().has_value(), stage >= 1) << what;
          EXPECT_EQ(p.sharded_save(), stage >= 1) << what;
          EXPECT_EQ(p.params_gathered(), stage == 3) << what;
          EXPECT_EQ(p.grads_whole(), stage < 2) << what;
          EXPECT_EQ(p.grads_per_unit(), world > 1 && stage >= 2) << what;
          EXPECT_EQ(p.owned_range(), stage >= 1 ? p.shards()[static_cast<size_t>(r)] : whole);
          const Residence ram = stage >= 1 ? Residence::shard : Residence::whole;
          EXPECT_EQ(p.optimizer().where, offload ? Residence::file : ram) << what;
          EXPECT_EQ(p.master().where, offload ? Residence::file : ram) << what;
          EXPECT_EQ(p.params().where, offload && zero == 3 ? Residence::file
                                      : stage == 3         ? Residence::shard
                                                           : Residence::whole)
              << what;
          EXPECT_EQ(p.grads().where, world > 1 && stage >= 2 ? Residence::shard : Residence::whole)
              << what;
          EXPECT_EQ(p.offload_dir().string(),
                    world > 1 ? fmt::format("/tmp/off/rank-{}", r) : std::string("/tmp/off"));
          params.push_back(p.params());
          master.push_back(p.master());
          grads.push_back(p.grads());
          optimizer.push_back(p.optimizer());
          owned += p.owned_range().size();
          // of_rank is the placement computed afresh for that rank.
          const StatePlacement fresh(f.layout, f.oc, o, {r, world});
          EXPECT_EQ(fresh.optimizer().range, p.optimizer().range) << what;
          EXPECT_EQ(fresh.params().range, p.params().range) << what;
          EXPECT_EQ(fresh.grads().range, p.grads().range) << what;
        }
        expect_tiles_or_whole(params, f.layout, what + " params");
        expect_tiles_or_whole(master, f.layout, what + " master");
        expect_tiles_or_whole(grads, f.layout, what + " grads");
        expect_tiles_or_whole(optimizer, f.layout, what + " optimizer");
        // Each rank's bytes of the sharded kinds add up to the whole's once; held whole, once
        // per rank.
        const int stage = world > 1 ? zero : 0;
        EXPECT_EQ(owned, stage >= 1 ? whole.size() : world * whole.size()) << what;
        ++checked;
      }
  EXPECT_EQ(checked, 24);
}

// Each rank's bytes of each kind, as the planner counts them (plan/memory_plan.cpp reads the
// same ranges): bf16 working weights, f32 master weights and gradients, at stage 3 over 3 ranks
// 1/3 of each to the cut granule.
TEST(StatePlacement, EachRanksBytesAreItsRangesBytes) {
  const Fixture f("adamw");
  const int64_t total = f.layout.total();
  const StatePlacement p0(f.layout, f.oc, options(3, false), {0, 3});
  int64_t params = 0, master = 0, grads = 0;
  for (int r = 0; r < 3; ++r) {
    const StatePlacement p = p0.of_rank(r);
    const int64_t pb = p.params().range.size() * 2, mb = p.master().range.size() * 4,
                  gb = p.grads().range.size() * 4;
    EXPECT_NEAR(double(pb), 2.0 * total / 3, 2 * 16) << r;
    EXPECT_NEAR(double(mb), 4.0 * total / 3, 4 * 16) << r;
    EXPECT_NEAR(double(gb), 4.0 * total / 3, 4 * 16) << r;
    params += pb, master += mb, grads += gb;
  }
  EXPECT_EQ(params, 2 * total);
  EXPECT_EQ(master, 4 * total);
  EXPECT_EQ(grads, 4 * total);
}

TEST(StatePlacement, OneRankIsStageZeroWhateverTheOptionSays) {
  const Fixture f;
  for (int zero = 0; zero <= 3; ++zero) {
    const StatePlacement p(f.layout, f.oc, options(zero, false), {0, 1});
    EXPECT_EQ(p.stage(), 0);
    EXPECT_FALSE(p.owned());
    EXPECT_FALSE(p.params_gathered());
    EXPECT_EQ(p.params().where, Residence::whole);
    EXPECT_EQ(p.grads().where, Residence::whole);
    EXPECT_EQ(p.shards().size(), 1u);
  }
}

// The gradients: bf16 ones per unit at every stage and in one process, into an accumulator of
// their own; --sync-every-micro-batch per unit into the whole f32 slab at stages 0-1; in a file
// with --offload-grads (one process), which keeps them per unit itself.
TEST(StatePlacement, GradientsPerUnitInBf16SyncedOrInAFile) {
  const Fixture f;
  StateOptions bf16 = options(0, false);
  bf16.grad_dtype = DType::bf16;
  const StatePlacement one(f.layout, f.oc, bf16, {0, 1});
  EXPECT_TRUE(one.grads_per_unit());
  EXPECT_TRUE(one.grads_own_accumulator());
  EXPECT_EQ(one.grads().where, Residence::whole);
  StateOptions sync = options(1, false);
  sync.sync_every_micro_batch = true;
  const StatePlacement synced(f.layout, f.oc, sync, {1, 2});
  EXPECT_TRUE(synced.grads_per_unit());
  EXPECT_FALSE(synced.grads_own_accumulator());
  EXPECT_EQ(synced.grads().where, Residence::whole);
  EXPECT_FALSE(StatePlacement(f.layout, f.oc, sync, {0, 1}).grads_per_unit());
  StateOptions file = options(0, true);
  file.offload_grads = true;
  file.grad_dtype = DType::bf16;
  const StatePlacement filed(f.layout, f.oc, file, {0, 1});
  EXPECT_FALSE(filed.grads_per_unit());
  EXPECT_EQ(filed.grads().where, Residence::file);
  EXPECT_EQ(filed.grads().range, filed.whole());
  // Without master weights (fp32, or pure bf16) there are none anywhere.
  const StatePlacement bare(f.layout, f.oc, options(2, false, /*master=*/false), {1, 2});
  EXPECT_EQ(bare.master().where, Residence::none);
  EXPECT_EQ(bare.optimizer().where, Residence::shard);
}

// The layout-free questions the options' checks, the search and the collectives' count ask
// (nothing outside state/ decodes a stage): what each stage shards over several ranks, nothing
// with one; a placement's sharding() is the static answer for its options and world, and
// agrees with where it puts each kind; which stages may offload or update in the backward.
TEST(StatePlacement, TheLayoutFreeQuestionsFollowTheStage) {
  const Fixture f;
  for (int world : {1, 2, 3})
    for (int zero = 0; zero <= 3; ++zero) {
      const std::string what = fmt::format("W={} --zero {}", world, zero);
      const StateOptions o = options(zero, false);
      const StateSharding s = StatePlacement::sharding(o, world);
      const int stage = world > 1 ? zero : 0;
      EXPECT_EQ(s.optimizer, stage >= 1) << what;
      EXPECT_EQ(s.grads, stage >= 2) << what;
      EXPECT_EQ(s.params, stage == 3) << what;
      const StatePlacement p(f.layout, f.oc, o, {0, world});
      EXPECT_EQ(p.sharding().optimizer, s.optimizer) << what;
      EXPECT_EQ(p.sharding().grads, s.grads) << what;
      EXPECT_EQ(p.sharding().params, s.params) << what;
      EXPECT_EQ(p.optimizer().where == Residence::shard, s.optimizer) << what;
      EXPECT_EQ(p.params_gathered(), s.params) << what;
      EXPECT_EQ(p.grads_whole(), !s.grads) << what;
      EXPECT_EQ(StatePlacement::allows_optimizer_offload(o, world), world == 1 || zero >= 1)
          << what;
      EXPECT_EQ(StatePlacement::allows_params_offload(o, world), world == 1 || zero == 3)
          << what;
      EXPECT_EQ(StatePlacement::allows_update_in_backward(o, world), world == 1 || zero >= 2)
          << what;
      StateOptions sync = o;
      sync.sync_every_micro_batch = true;
      EXPECT_EQ(StatePlacement::allows_update_in_backward(sync, world), world == 1) << what;
    }
}

TEST(StatePlacement, BadCoordinatesAndStagesAreRefused) {
  const Fixture f;
  EXPECT_THROW(StatePlacement(f.layout, f.oc, options(0, false), {2, 2}), Error);
  EXPECT_THROW(StatePlacement(f.layout, f.oc, options(0, false), {0, 0}), Error);
  EXPECT_THROW(StatePlacement(f.layout, f.oc, options(4, false), {0, 2}), Error);
  const StatePlacement p(f.layout, f.oc, options(1, false), {0, 2});
  EXPECT_THROW(p.of_rank(2), Error);
  EXPECT_STREQ(residence_name(Residence::file), "file");
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// --precision fp8 stores its linears' working weights as FP8 (Note [FP8], "Storage") where the
// working weights are whole in RAM and the master weights in RAM, whole or a shard: one process
// and ZeRO stages 0-2 without offload (stages 1-2 agree on the scales and gather the codes).
// Elsewhere they stay bf16, and fp8_fallback() says why: stage 3 gathers bf16 units, offload
// moves bf16 ranges of the layout.
TEST(StatePlacement, Fp8WeightsAreStoredWhereTheWorkingWeightsAreWholeAndTheMasterInRam) {
  const Fixture f;
  auto fp8 = [](int zero, bool offload_optimizer, bool offload_params) {
    StateOptions o;
    o.zero = zero;
    o.working_dtype = DType::bf16;
    o.master_weights = true;
    o.fp8_weights = true;
    o.offload_optimizer = offload_optimizer;
    o.offload_params = offload_params;
    o.offload_dir = "/tmp/off";
    return o;
  };
  for (int zero = 0; zero <= 3; ++zero) {
    const StatePlacement one(f.layout, f.oc, fp8(zero, false, false), {0, 1});
    EXPECT_TRUE(one.params_fp8());
    EXPECT_EQ(one.fp8_fallback(), "");
  }
  for (int r = 0; r < 2; ++r) {
    for (int zero = 0; zero <= 2; ++zero) {
      const StatePlacement p(f.layout, f.oc, fp8(zero, false, false), {r, 2});
      EXPECT_TRUE(p.params_fp8()) << "stage " << zero;
      EXPECT_EQ(p.master().where, zero == 0 ? Residence::whole : Residence::shard);
    }
    const StatePlacement three(f.layout, f.oc, fp8(3, false, false), {r, 2});
    EXPECT_FALSE(three.params_fp8());
    EXPECT_NE(three.fp8_fallback().find("ZeRO stage 3"), std::string::npos);
    for (int zero = 1; zero <= 3; ++zero) {
      const StatePlacement off(f.layout, f.oc, fp8(zero, true, false), {r, 2});
      EXPECT_FALSE(off.params_fp8()) << "stage " << zero;
      EXPECT_NE(off.fp8_fallback().find(zero == 3 ? "ZeRO stage 3" : "--offload-optimizer"),
                std::string::npos);
    }
  }
  const StatePlacement opt(f.layout, f.oc, fp8(0, true, false), {0, 1});
  EXPECT_FALSE(opt.params_fp8());
  EXPECT_NE(opt.fp8_fallback().find("--offload-optimizer"), std::string::npos);
  const StatePlacement params(f.layout, f.oc, fp8(0, true, true), {0, 1});
  EXPECT_FALSE(params.params_fp8());
  EXPECT_NE(params.fp8_fallback().find("--offload-params"), std::string::npos);
  StateOptions bf16 = fp8(0, false, false);
  bf16.fp8_weights = false;
  EXPECT_FALSE(StatePlacement(f.layout, f.oc, bf16, {0, 1}).params_fp8());
  EXPECT_EQ(StatePlacement(f.layout, f.oc, bf16, {0, 1}).fp8_fallback(), "");
}

}  // namespace
}  // namespace memfit
