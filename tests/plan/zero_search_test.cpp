// --zero auto (and memfit plan --auto over several ranks): the search ranges over the ZeRO
// stages of kSearchStages (0-3), a candidate fits when every rank's planned peak fits the per-rank
// budget, the step-time estimate prices each stage's collectives, and ties go to the lower
// stage (Note [Fit a budget]). --max-model over several ranks finds a larger model under the
// same per-rank budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/core/error.h"
#include "memfit/dist/comm_volume.h"
#include "memfit/model/param_layout.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/max_model.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/search.h"
#include "memfit/state/state_placement.h"
#include "plan_test_util.h"

namespace memfit {
namespace {

constexpr size_t kMiB = 1 << 20;

std::string empty_dir() { return test::empty_data_dir("zero_search"); }

// gpt2-tiny at 4 layers x 256: the model state (AdamW in bf16: 18 bytes a parameter at stage 0)
// outweighs the activations, so the stage decides what fits.
TrainConfig config(int world, const std::string& precision = "bf16") {
  TrainConfig c;
  c.model = "gpt2-tiny";
  c.n_layer = 4;
  c.d_model = 256;
  c.n_head = 4;
  c.seq_len = 32;
  c.batch = 1;
  c.steps = 0;
  c.precision = precision;
  c.ranks = world;
  c.zero_auto = true;
  c.ckpt = "auto";
  c.act_compress = "none";  // fewer candidates: the stage is what is tested
  c.mem_limit = "1GiB";
  c.data_dir = empty_dir();
  return c;
}

size_t largest_rank_peak(const RunSpec& run) {
  size_t most = 0;
  for (int r = 0; r < run.world; ++r) most = std::max(most, plan_memory(run, r).peak_bytes);
  return most;
}

// The least peak of any policy at one stage (the largest rank's).
size_t least_peak_at(const SearchResult& s, int zero) {
  size_t least = SIZE_MAX;
  for (const Candidate& c : s.candidates)
    if (c.zero == zero) least = std::min(least, c.peak_bytes);
  return least;
}

TEST(ZeroSearch, EveryCandidateIsPlannedAtEveryStageWithTheLargestRanksPeak) {
  const RunSpec spec = resolve_run(config(3));  // three ranks: uneven shards
  ASSERT_TRUE(spec.zero_auto);
  const SearchSpace space = SearchSpace::of(spec);
  ASSERT_TRUE(space.stages);
  const SearchResult s = search_training(spec, 1024 * kMiB, space);
  EXPECT_TRUE(s.with_stage);
  EXPECT_TRUE(s.per_rank);
  std::set<std::pair<std::string, int>> seen;
  for (const Candidate& c : s.candidates) {
    seen.insert({c.ckpt, c.zero});
    const RunSpec run = apply_candidate(spec, c);
    EXPECT_EQ(run.zero, c.zero);
    EXPECT_FALSE(run.zero_auto);
    EXPECT_EQ(c.peak_bytes, largest_rank_peak(run)) << c.ckpt << " --zero " << c.zero;
    EXPECT_EQ(c.peak_bytes, plan_memory(run, c.peak_rank).peak_bytes);
  }
  const size_t policies = checkpoint_candidates(4, spec.attention).size();
  EXPECT_EQ(seen.size(), policies * std::size(kSearchStages));
  EXPECT_EQ(s.candidates.size(), seen.size());
}

// plan_largest_rank finds the largest rank from what differs between ranks and plans it whole:
// the same as planning every rank, at every stage, in RAM and offloaded (stages 1-3), in bf16
// and fp32, over uneven shards (8-bit AdamW's blocks); and the largest rank's offload files.
TEST(ZeroSearch, TheLargestRankIsTheLargestOfEveryRanksPlan) {
  int checked = 0, rank0_not_largest = 0, offloaded = 0;
  for (const char* precision : {"bf16", "fp32"})
    for (int world : {2, 3, 5})
      for (int zero = 0; zero <= 3; ++zero)
        for (bool offload : {false, true}) {
          TrainConfig c = config(world, precision);
          if (offload) {
            if (zero == 0) continue;  // refused: every rank would write the whole state
            // Each rank's ring is sized by its own largest piece, its files by its shard.
            c.offload_optimizer = "nvme";
            c.offload_dir = empty_dir() + "/offload";
          }
          c.optim.name = "adamw8bit";  // blocks of 2048: shards cut unevenly
          c.zero_auto = false;
          c.zero = zero;
          c.ckpt = "none";
          c.bucket_mb = 0.1;  // several buckets: receive buffers differ by rank
          const RunSpec run = resolve_run(c);
          int rank = -1;
          uint64_t disk = 0, expected_disk = 0;
          const PlanReport most = plan_largest_rank(run, &rank, &disk);
          size_t expected = 0;
          int expected_rank = 0;
          for (int r = 0; r < world; ++r) {
            const PlanReport p = plan_memory(run, r);
            if (p.peak_bytes > expected) expected = p.peak_bytes, expected_rank = r;
            expected_disk = std::max(expected_disk, p.disk_bytes);
          }
          const std::string what = fmt::format("{} W={} --zero {}{}", precision, world, zero,
                                               offload ? " offloaded" : "");
          EXPECT_EQ(most.peak_bytes, expected) << what;
          EXPECT_EQ(rank, expected_rank) << what;
          EXPECT_EQ(most.by_category, plan_memory(run, rank).by_category) << what;
          EXPECT_EQ(disk, expected_disk) << what;
          EXPECT_EQ(disk > 0, offload) << what;
          ++checked;
          offloaded += offload;
          rank0_not_largest += expected_rank != 0;
        }
  EXPECT_EQ(checked, 42);
  EXPECT_EQ(offloaded, 18);
  EXPECT_GT(rank0_not_largest, 0);  // the ranks differ: the search must not take rank 0's
}

TEST(ZeroSearch, AHigherStageIsChosenWhenNoLowerStageFitsAndItsEveryRankFits) {
  const RunSpec spec = resolve_run(config(2));
  const SearchResult all = search_training(spec, 1024 * kMiB, SearchSpace::of(spec));
  const size_t stage0 = least_peak_at(all, 0), stage1 = least_peak_at(all, 1),
               stage2 = least_peak_at(all, 2);
  // Sharding the master weights and AdamW's moments is most of a bf16 model's state.
  ASSERT_LT(stage1, stage0);
  ASSERT_LE(stage2, stage1);
  // A budget that stage 0 fits under no policy.
  const size_t limit = stage0 - 1;
  const SearchResult s = search_training(spec, limit, SearchSpace::of(spec));
  ASSERT_TRUE(s.fits) << s.message;
  EXPECT_GE(s.choice.zero, 1);
  for (const Candidate& c : s.candidates)
    if (c.zero == 0) { EXPECT_FALSE(c.fits) << c.ckpt; }
  // The chosen run's planned peak fits on every rank.
  const RunSpec run = apply_candidate(spec, s.choice);
  for (int r = 0; r < run.world; ++r) EXPECT_LE(plan_memory(run, r).peak_bytes, limit) << r;
  EXPECT_NE(s.message.find("--zero "), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("per rank"), std::string::npos) << s.message;
  // Below every stage's least peak nothing fits, and the smallest footprint is the least.
  size_t least = SIZE_MAX;
  for (int zero : kSearchStages) least = std::min(least, least_peak_at(all, zero));
  const SearchResult none = search_training(spec, least - 1, SearchSpace::of(spec));
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.smallest.peak_bytes, least);
}

// The step-time estimate adds each stage's collectives on this host's link (the memory-copy
// rate, and a latency a message; the sums of the reduced ones at the streaming rate), and a
// ZeRO rank updates its shard alone.
TEST(ZeroSearch, TheEstimatePricesEachStagesCollectives) {
  const Calibration& rates = machine_calibration();
  ASSERT_GT(rates.copy_bytes_per_s, 0);
  TrainConfig c = config(2);
  c.zero_auto = false;
  c.ckpt = "none";
  double comm[3] = {0, 0, 0};
  for (int zero : {0, 1, 2}) {
    c.zero = zero;
    const RunSpec run = resolve_run(c);
    const PlanReport p = plan_training(run);
    const int64_t n = ParamLayout(p.model).total();
    const dist::CommVolume v =
        dist::step_comm_volume(n, 2, 2, StatePlacement::sharding(run.state_options(), run.world));
    comm[zero] = p.step_time.comm;
    // On this host's link (one node): a rank sends half what it copies at half the copy rate,
    // and each of the rings' messages pays the default latency.
    EXPECT_DOUBLE_EQ(p.step_time.comm,
                     v.copied_bytes(2) / rates.copy_bytes_per_s +
                         ring_messages(v, 2, run.bucket_bytes) * kDefaultIntraLatency +
                         v.summed_bytes(2) / rates.stream_bytes_per_s);
    EXPECT_GT(ring_messages(v, 2, run.bucket_bytes), 0);
    EXPECT_NEAR(p.est_step_seconds, p.step_time.total(), 1e-15);
  }
  // bf16 working weights, f32 gradients: stage 1 all-reduces (8 bytes a parameter sent and
  // received, per element of the ring) and all-gathers (2); stage 2 reduce-scatters (4) and
  // all-gathers (2); stage 0 all-reduces (8).
  EXPECT_GT(comm[1], comm[0]);
  EXPECT_GT(comm[0], comm[2]);
  // One rank: no collectives.
  TrainConfig one = config(1);
  one.zero_auto = false;
  one.ckpt = "none";
  EXPECT_EQ(plan_training(resolve_run(one)).step_time.comm, 0);
  // Stage 1 sends more than stage 2 and holds no less: at the same policy it is never chosen
  // over stage 2, and its estimate says why.
  const RunSpec spec = resolve_run(config(2));
  const SearchResult s = search_training(spec, 1024 * kMiB, SearchSpace::of(spec));
  for (const Candidate& a : s.candidates)
    for (const Candidate& b : s.candidates)
      if (a.ckpt == b.ckpt && a.zero == 1 && b.zero == 2) {
        EXPECT_TRUE(faster(b, a)) << a.ckpt;
      }
  EXPECT_NE(s.choice.zero, 1);
}

// Stage 3 gathers the working weights on top of stage 2's collectives for the same update: it
// is slower at every policy, so the search takes it only where stage 2 does not fit.
TEST(ZeroSearch, StageThreeOnlyWhereStageTwoDoesNotFit) {
  TrainConfig c = config(4);
  c.n_layer = 8;
  const RunSpec spec = resolve_run(c);
  const SearchResult all = search_training(spec, 1024 * kMiB, SearchSpace::of(spec));
  EXPECT_EQ(all.choice.zero, 2);
  int compared = 0;
  for (const Candidate& two : all.candidates)
    for (const Candidate& three : all.candidates)
      if (two.ckpt == three.ckpt && two.zero == 2 && three.zero == 3) {
        EXPECT_TRUE(faster(two, three)) << two.ckpt;
        const size_t comm = static_cast<size_t>(Category::comm);
        EXPECT_GT(three.by_category[comm], two.by_category[comm]);  // the gather buffers
        ++compared;
      }
  EXPECT_GT(compared, 0);
  const size_t stage2 = least_peak_at(all, 2), stage3 = least_peak_at(all, 3);
  ASSERT_LT(stage3, stage2);  // sharded working weights outweigh the gather buffers here
  const SearchResult s = search_training(spec, stage2 - 1, SearchSpace::of(spec));
  ASSERT_TRUE(s.fits) << s.message;
  EXPECT_EQ(s.choice.zero, 3);
  EXPECT_LE(largest_rank_peak(apply_candidate(spec, s.choice)), stage2 - 1);
}

TEST(ZeroSearch, AsFastGoesToTheLowerStage) {
  Candidate low, high;
  low.est_step_seconds = 1.0;
  high.est_step_seconds = 1.0 - 1e-12;  // the same time: within the search's rounding
  low.zero = 0;
  high.zero = 2;
  low.peak_bytes = 200;
  high.peak_bytes = 100;  // less memory does not outweigh the stage
  EXPECT_TRUE(preferred(low, high));
  EXPECT_FALSE(preferred(high, low));
  high.zero = 1;
  EXPECT_TRUE(preferred(low, high));
  high.est_step_seconds = 0.9;  // faster wins whatever the stage
  EXPECT_TRUE(preferred(high, low));
}

TEST(ZeroSearch, WithOneRankTheStageIsZeroAndNotSearched) {
  const RunSpec spec = resolve_run(config(1));
  EXPECT_EQ(spec.zero, 0);
  const SearchSpace space = SearchSpace::of(spec);
  EXPECT_FALSE(space.stages);
  const SearchResult s = search_training(spec, 1024 * kMiB, space);
  EXPECT_FALSE(s.with_stage);
  EXPECT_FALSE(s.per_rank);
  for (const Candidate& c : s.candidates) EXPECT_EQ(c.zero, 0);
  // train()'s resolution: stage 0, and the note says why.
  const AutoResolution r = resolve_auto(config(1));
  EXPECT_EQ(r.spec().zero, 0);
  EXPECT_FALSE(r.spec().zero_auto);
  EXPECT_NE(r.note.find("--zero auto with one rank: stage 0"), std::string::npos) << r.note;
}

TEST(ZeroSearch, TheResolvedRunCarriesTheChosenStage) {
  TrainConfig c = config(2);
  // Between stage 0's least peak and the higher stages': the search must shard.
  const RunSpec spec = resolve_run(c);
  const SearchResult all = search_training(spec, 1024 * kMiB, SearchSpace::of(spec));
  c.mem_limit = fmt::format("{}", least_peak_at(all, 0) - 1);
  const AutoResolution r = resolve_auto(c);
  ASSERT_TRUE(r.planned);
  EXPECT_GE(r.spec().zero, 1);  // what trainer_state.json and the agreement read
  EXPECT_FALSE(r.spec().zero_auto);
  EXPECT_TRUE(r.asked.zero_auto);  // the run as asked, before the choice
  EXPECT_EQ(r.search.choice.zero, r.spec().zero);
}

// Over several ranks --offload-dir without --offload-optimizer makes --zero auto try every
// candidate also offloaded at the stages where each rank's state is a shard (1, 2, 3), never at
// stage 0; each offloaded candidate's peak is its largest rank's (the ring beside the stage's
// buffers, no master or optimizer bytes); a budget no candidate in RAM fits is met offloaded;
// a fixed stage is searched offloaded only if it is 1 to 3.
TEST(ZeroSearch, OverSeveralRanksTheSearchTriesOffloadAtStagesOneToThree) {
  TrainConfig c = config(2);
  // 16 blocks: each rank's shard of the state outweighs the ring of three blocks' pieces (with
  // 4 the ring is the larger, and offload only costs RAM). One policy: the stage and offload
  // are what is searched.
  c.n_layer = 16;
  c.ckpt = "none";
  c.offload_dir = empty_dir() + "/offload";
  const RunSpec spec = resolve_run(c);
  ASSERT_TRUE(spec.offload_open);
  ASSERT_TRUE(SearchSpace::of(spec).offload);
  const SearchResult all = search_training(spec, 1024 * kMiB, SearchSpace::of(spec));
  EXPECT_TRUE(all.fits);
  std::set<int> offloaded_stages;
  size_t least_ram = SIZE_MAX, least_offloaded = SIZE_MAX;
  for (const Candidate& k : all.candidates) {
    if (!k.offload) {
      least_ram = std::min(least_ram, k.peak_bytes);
      continue;
    }
    offloaded_stages.insert(k.zero);
    const RunSpec run = apply_candidate(spec, k);
    EXPECT_TRUE(run.offload.optimizer);
    EXPECT_EQ(k.peak_bytes, largest_rank_peak(run)) << k.ckpt << " --zero " << k.zero;
    EXPECT_EQ(k.by_category[static_cast<size_t>(Category::optimizer)], 0u);
    EXPECT_EQ(k.by_category[static_cast<size_t>(Category::master)], 0u);
    least_offloaded = std::min(least_offloaded, k.peak_bytes);
  }
  EXPECT_EQ(offloaded_stages, (std::set<int>{1, 2, 3}));
  // bf16 AdamW's moments and master weights are most of this model's state: offloaded is less.
  ASSERT_LT(least_offloaded, least_ram);
  const SearchResult s = search_training(spec, least_ram - 1, SearchSpace::of(spec));
  ASSERT_TRUE(s.fits) << s.message;
  EXPECT_TRUE(s.choice.offload);
  EXPECT_GE(s.choice.zero, 1);
  EXPECT_NE(s.message.find("--offload-optimizer nvme"), std::string::npos) << s.message;
  const RunSpec chosen = apply_candidate(spec, s.choice);
  for (int r = 0; r < chosen.world; ++r)
    EXPECT_LE(plan_memory(chosen, r).peak_bytes, least_ram - 1) << r;
  // A fixed stage with --ckpt auto: offload searched at stage 2, not at stage 0 (every rank
  // would hold the whole state).
  c.zero_auto = false;
  c.zero = 2;
  c.ckpt = "auto";
  const RunSpec two = resolve_run(c);
  ASSERT_TRUE(SearchSpace::of(two).offload);
  bool any = false;
  for (const Candidate& k : search_training(two, 1024 * kMiB, SearchSpace::of(two)).candidates) {
    EXPECT_EQ(k.zero, 2);
    any |= k.offload;
  }
  EXPECT_TRUE(any);
  c.zero = 0;
  EXPECT_FALSE(SearchSpace::of(resolve_run(c)).offload);
  c.ranks = 1;
  EXPECT_TRUE(SearchSpace::of(resolve_run(c)).offload);  // one process: tried
}

// --zero auto with --offload-optimizer nvme over several ranks searches the stages that allow
// it (1 to 3), every candidate offloaded.
TEST(ZeroSearch, ZeroAutoWithOffloadSearchesStagesOneToThree) {
  TrainConfig c = config(2);
  c.offload_dir = empty_dir() + "/offload";
  c.offload_optimizer = "nvme";
  const RunSpec spec = resolve_run(c);
  EXPECT_FALSE(SearchSpace::of(spec).offload);  // not a choice: asked for
  const SearchResult s = search_training(spec, 1024 * kMiB, SearchSpace::of(spec));
  ASSERT_TRUE(s.fits) << s.message;
  std::set<int> stages;
  for (const Candidate& k : s.candidates) {
    EXPECT_TRUE(k.offload);
    stages.insert(k.zero);
  }
  EXPECT_EQ(stages, (std::set<int>{1, 2, 3}));
  EXPECT_GE(s.choice.zero, 1);
  // --disk-limit is per rank: the largest rank's files (the shards are the same at every
  // stage) fit it, one byte less fits nothing.
  uint64_t most = 0;
  for (int r = 0; r < 2; ++r)
    most = std::max(most, plan_memory(apply_candidate(spec, s.choice), r).disk_bytes);
  RunSpec bounded = spec;
  bounded.offload.disk_limit = most;
  EXPECT_TRUE(search_training(bounded, 1024 * kMiB, SearchSpace::of(bounded)).fits);
  bounded.offload.disk_limit = most - 1;
  EXPECT_FALSE(search_training(bounded, 1024 * kMiB, SearchSpace::of(bounded)).fits);
}

TEST(ZeroSearch, ZeroAutoNeedsABudget) {
  TrainConfig c = config(2);
  c.mem_limit.clear();
  c.ckpt = "none";
  try {
    resolve_run(c);
    FAIL() << "accepted --zero auto without --mem-limit";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--zero auto"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--mem-limit"), std::string::npos) << e.what();
  }
}

// "The largest model that trains with 4 ranks of --mem-limit X each, against one process of
// X": sharding the master weights and the optimizer state leaves room for a deeper member.
TEST(ZeroSearch, MaxModelOverFourRanksAtStageTwoIsLargerUnderTheSamePerRankLimit) {
  TrainConfig c;
  c.model = "gpt2-tiny";  // vocabulary 512, context 64: small members
  c.seq_len = 32;
  c.batch = 1;
  c.precision = "bf16";
  c.act_compress = "none";
  c.data_dir = empty_dir();
  // Two threads' workspace, on any machine: at 16 (CI's many-thread rerun) the widened bf16
  // route's per-thread `ws.widen` (no AVX512_BF16: AVX2, Cascade Lake), which no rank shards,
  // bounds both runs alike at this limit.
  c.threads = 2;
  const size_t limit = 160 * kMiB;
  const MaxModelResult one = find_max_model(resolve_run(c), limit);
  c.ranks = 4;
  c.zero = 2;
  const RunSpec four_spec = resolve_run(c);
  const MaxModelResult four = find_max_model(four_spec, limit);
  ASSERT_TRUE(one.found);
  ASSERT_TRUE(four.found);
  ASSERT_FALSE(four.capped);
  EXPECT_EQ(four.world, 4);
  EXPECT_GT(four.best.params, one.best.params);
  EXPECT_GT(four.best.shape.n_layer, one.best.shape.n_layer);
  // Its every rank fits; the next member's largest rank does not, under any policy.
  const RunSpec run =
      apply_candidate(with_family_shape(four_spec, four.best.shape), four.best.search.choice);
  EXPECT_EQ(run.zero, 2);
  EXPECT_LE(largest_rank_peak(run), limit);
  for (const ShapeFit& f : four.neighbours)
    if (f.shape.n_layer == four.best.shape.n_layer + 1) { EXPECT_FALSE(f.fits()); }
}

}  // namespace
}  // namespace memfit
