// memfit plan --max-model: the family holds GPT-2's published shapes and grows with depth; the
// model it finds fits the budget, the next member does not under any policy (planned here, not
// taken from the search), and a larger budget finds a larger model.
#include "memfit/plan/max_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <string>

#include <fmt/format.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/plan/memory_plan.h"
#include "plan_test_util.h"

namespace memfit {
namespace {

std::string empty_dir() { return test::empty_data_dir("max_model"); }

TrainConfig tiny_vocab_config() {
  TrainConfig c;
  c.model = "gpt2-tiny";  // vocabulary 512, context 64: small members
  c.seq_len = 32;
  c.batch = 2;
  c.data_dir = empty_dir();  // no shards: staging is the loaders' fixed buffers
  return c;
}
RunSpec tiny_vocab() { return resolve_run(tiny_vocab_config()); }

constexpr size_t kMiB = 1 << 20;

TEST(Gpt2Family, HoldsGpt2sShapesAndGrowsWithDepth) {
  for (const char* name : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}) {
    const ModelConfig p = ModelConfig::preset(name);
    const FamilyShape s = gpt2_family_shape(p.n_layer);
    EXPECT_EQ(s.d_model, p.d_model) << name;
    EXPECT_EQ(s.n_head, p.n_head) << name;
  }
  int64_t last = 0;
  for (int n = 1; n <= kMaxFamilyLayers; ++n) {
    const FamilyShape s = gpt2_family_shape(n);
    EXPECT_EQ(s.d_model % 64, 0);
    EXPECT_EQ(s.d_model, 64 * s.n_head);
    const int64_t params = with_family_shape(tiny_vocab(), s).model.num_params();
    EXPECT_GT(params, last) << n << " layers";
    last = params;
  }
  EXPECT_EQ(gpt2_family_shape(1).d_model, 512);  // 533 by the line, rounded to 64
  EXPECT_THROW(gpt2_family_shape(0), ConfigError);
}

// The least peak of any policy --max-model could use for this member, over every micro-batch:
// none, full and every every:K (layers:LIST lies between none and full).
size_t least_peak(const RunSpec& base, FamilyShape shape) {
  size_t least = SIZE_MAX;
  RunSpec c = with_family_shape(base, shape);
  c.ckpt_auto = false;
  std::vector<std::string> policies = {"none", "full"};
  for (int K = 2; K <= shape.n_layer; ++K) policies.push_back(fmt::format("every:{}", K));
  for (const std::string& p : policies) {
    c.ckpt = CheckpointPolicy::parse(p);
    least = std::min(least, plan_training(c).peak_bytes);
  }
  return least;
}

TEST(MaxModel, FitsAndTheNextMemberDoesNotAndItGrowsWithTheBudget) {
  const RunSpec base = tiny_vocab();
  const MaxModelResult small = find_max_model(base, 200 * kMiB);
  ASSERT_TRUE(small.found);
  EXPECT_GE(small.best.shape.n_layer, 2);  // the test means something: a few members fit
  // Its plan fits, as training would plan it.
  const RunSpec run = apply_candidate(with_family_shape(base, small.best.shape),
                                      small.best.search.choice);
  EXPECT_EQ(run.ckpt.name(), small.best.search.choice.ckpt);
  const PlanReport p = plan_training(run);
  EXPECT_LE(p.peak_bytes, 200 * kMiB);
  EXPECT_EQ(p.model.num_params(), small.best.params);
  // The next member fits under no policy.
  const FamilyShape next = gpt2_family_shape(small.best.shape.n_layer + 1);
  EXPECT_GT(least_peak(base, next), 200 * kMiB);
  // One byte short of the next member's least peak, the answer stays; exactly at it, it moves.
  EXPECT_EQ(find_max_model(base, least_peak(base, next) - 1).best.shape.n_layer,
            small.best.shape.n_layer);
  EXPECT_EQ(find_max_model(base, least_peak(base, next)).best.shape.n_layer, next.n_layer);

  const MaxModelResult large = find_max_model(base, 800 * kMiB);
  ASSERT_TRUE(large.found);
  EXPECT_GT(large.best.params, small.best.params);
  EXPECT_GT(large.best.shape.n_layer, small.best.shape.n_layer);
  // Neighbours: around the best, by depth, the deeper ones not fitting.
  for (const ShapeFit& f : large.neighbours)
    EXPECT_EQ(f.search.fits, f.shape.n_layer <= large.best.shape.n_layer) << f.shape.n_layer;
}

// --offload-optimizer nvme: a member fits only if its offload files fit the disk too.
TEST(MaxModel, WithOffloadTheFilesMustFitTheDisk) {
  TrainConfig c = tiny_vocab_config();
  c.offload_optimizer = "nvme";
  c.offload_dir = empty_dir() + "/offload";
  RunSpec base = resolve_run(c);
  const MaxModelResult free_disk = find_max_model(base, 300 * kMiB);
  ASSERT_TRUE(free_disk.found);
  ASSERT_FALSE(free_disk.capped);
  EXPECT_GT(free_disk.best.disk_bytes, 0u);
  EXPECT_GT(free_disk.disk_limit, free_disk.best.disk_bytes);  // the free space
  base.offload.disk_limit = free_disk.best.disk_bytes - 1;
  const MaxModelResult r = find_max_model(base, 300 * kMiB);
  ASSERT_TRUE(r.found);
  EXPECT_LT(r.best.shape.n_layer, free_disk.best.shape.n_layer);
  EXPECT_LE(r.best.disk_bytes, base.offload.disk_limit);
  EXPECT_TRUE(r.best.fits());
  bool next_seen = false;
  for (const ShapeFit& f : r.neighbours)
    if (f.shape.n_layer == r.best.shape.n_layer + 1) {
      next_seen = true;
      EXPECT_FALSE(f.fits());
      EXPECT_TRUE(f.search.fits || !f.disk_fits);
      // The table's reason names what did not fit: the disk when the RAM did.
      const Candidate& n = f.search.choice;
      const std::string why = n.why_over(300 * kMiB, f.search.disk_limit);
      if (n.peak_bytes <= 300 * kMiB) {
        EXPECT_EQ(why.rfind("the disk: ", 0), 0u) << why;
        EXPECT_GT(n.disk_bytes, base.offload.disk_limit);
      } else {
        EXPECT_NE(why.find("MiB over"), std::string::npos) << why;
      }
    }
  EXPECT_TRUE(next_seen);
}

// Over several ranks (--zero 2) each rank's files are its shard's: a member's disk bytes are its
// largest rank's, what a per-rank --disk-limit must hold, well under one process's files.
TEST(MaxModel, WithOffloadOverRanksTheFilesAreTheLargestRanks) {
  TrainConfig c = tiny_vocab_config();
  c.offload_optimizer = "nvme";
  c.offload_dir = empty_dir() + "/offload";
  c.ranks = 2;
  c.zero = 2;
  const RunSpec base = resolve_run(c);
  const MaxModelResult r = find_max_model(base, 300 * kMiB);
  ASSERT_TRUE(r.found);
  const RunSpec best =
      apply_candidate(with_family_shape(base, r.best.shape), r.best.search.choice);
  uint64_t most = 0;
  for (int q = 0; q < 2; ++q) most = std::max(most, plan_memory(best, q).disk_bytes);
  EXPECT_EQ(r.best.disk_bytes, most);
  RunSpec one = best;
  one.world = 1;
  EXPECT_LT(2 * r.best.disk_bytes, 3 * plan_memory(one).disk_bytes);  // about half
}

// --offload-dir alone: each member's search may offload (the optimizer, the working weights,
// the gradients), its files weighed against the free disk, so a larger member fits than in RAM;
// the winner offloads and its files fit.
TEST(MaxModel, WithTheOffloadDirAloneTheSearchMayOffload) {
  TrainConfig c = tiny_vocab_config();
  const RunSpec ram = resolve_run(c);
  c.offload_dir = empty_dir() + "/offload";
  const RunSpec open = resolve_run(c);
  ASSERT_TRUE(open.offload_open && open.offload_grads_open);
  const MaxModelResult in_ram = find_max_model(ram, 300 * kMiB);
  const MaxModelResult r = find_max_model(open, 300 * kMiB);
  ASSERT_TRUE(in_ram.found && r.found);
  EXPECT_GT(r.best.shape.n_layer, in_ram.best.shape.n_layer);
  const Candidate& choice = r.best.search.choice;
  EXPECT_TRUE(choice.offload);
  EXPECT_GT(r.best.disk_bytes, 0u);
  EXPECT_LE(r.best.disk_bytes, r.disk_limit);
  bool grads = false;
  for (const Candidate& k : r.best.search.candidates) grads = grads || k.offload_grads;
  EXPECT_TRUE(grads) << "the gradients on disk were not tried";
  EXPECT_EQ(in_ram.disk_limit, 0u);
}

TEST(MaxModel, NothingFitsNamesTheSmallestMember) {
  const MaxModelResult r = find_max_model(tiny_vocab(), 4 * kMiB);
  EXPECT_FALSE(r.found);
  EXPECT_EQ(r.best.shape.n_layer, 1);
  EXPECT_FALSE(r.best.search.fits);
  EXPECT_EQ(r.best.search.choice.peak_bytes, least_peak(tiny_vocab(), gpt2_family_shape(1)));
}

}  // namespace
}  // namespace memfit
