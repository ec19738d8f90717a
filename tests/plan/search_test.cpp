// The search behind --ckpt auto and --auto-batch: it picks the fastest configuration that fits,
// every faster one it rejected does not fit (checked against an enumeration of every policy the
// grammar can name, not the search's own list), the micro-batches keep the global batch,
// compression is tried beside the policies unless --act-compress is given, and when nothing fits
// the smallest footprint it reports is the true minimum.
#include "memfit/plan/search.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/core/error.h"
#include "memfit/core/scoped_threads.h"
#include "memfit/memory/pool.h"
#include "plan_test_util.h"
#include "memfit/plan/memory_plan.h"

namespace memfit {
namespace {

std::string empty_dir() { return test::empty_data_dir("search"); }

constexpr int kLayers = 4;

TrainConfig tiny(const char* attention) {
  TrainConfig c;
  c.model = "gpt2-tiny";
  c.n_layer = kLayers;
  c.seq_len = 48;
  c.batch = 4;
  c.grad_accum = 2;
  c.attention = attention;
  c.data_dir = empty_dir();  // no shards: staging is the loaders' fixed buffers, no data read
  return c;
}

// Every policy --ckpt can name for kLayers blocks: none, selective, full, every:K for every K,
// and layers: with every subset of the blocks.
std::vector<std::string> every_policy() {
  std::vector<std::string> out = {"none", "selective", "full"};
  for (int K = 1; K <= kLayers; ++K) out.push_back(fmt::format("every:{}", K));
  for (unsigned set = 1; set < (1u << kLayers); ++set) {
    std::string p = "layers:";
    for (int l = 0; l < kLayers; ++l)
      if (set & (1u << l)) p += fmt::format("{}{}", p.size() > 7 ? "," : "", l);
    out.push_back(p);
  }
  return out;
}

PlanReport plan(TrainConfig c, const std::string& ckpt, int batch, int accum) {
  c.ckpt = ckpt;
  c.batch = batch;
  c.grad_accum = accum;
  c.auto_batch = false;
  return plan_training(resolve_run(c));
}

TEST(CheckpointCandidates, OneOfEachUsefulPolicy) {
  using V = std::vector<std::string>;
  EXPECT_EQ(checkpoint_candidates(1, AttentionKind::flash), (V{"none", "full"}));
  EXPECT_EQ(checkpoint_candidates(3, AttentionKind::plain),
            (V{"none", "selective", "layers:0", "layers:0,1", "every:2", "full"}));
  // 10 blocks: every:2 keeps 5 segment inputs, every:3 4, every:4 3, every:5 2 (every:6..9 also
  // keep 2, with longer segments), so they are left out.
  EXPECT_EQ(checkpoint_candidates(10, AttentionKind::flash),
            (V{"none", "layers:0", "layers:0,1", "layers:0-2", "layers:0-3", "layers:0-4",
               "layers:0-5", "layers:0-6", "layers:0-7", "layers:0-8", "every:2", "every:3",
               "every:4", "every:5", "full"}));
  EXPECT_EQ(micro_batch_candidates(12), (std::vector<int>{1, 2, 3, 4, 6, 12}));
}

// The ranks of a run agree on the search's choice by sending it as JSON (adopt_lead_choice):
// every field comes back, and applying it gives the same run as applying the original.
TEST(Search, ACandidateRoundTripsThroughJson) {
  Candidate c;
  c.ckpt = "every:2";
  c.act_compress = ActCompress::int8;
  c.offload = c.offload_params = true;
  c.batch = 3;
  c.grad_accum = 5;
  c.zero = 3;
  c.peak_bytes = (size_t{1} << 40) + 7;
  c.peak_rank = 1;
  c.est_step_seconds = 0.1 + 1e-17;
  c.by_category[static_cast<size_t>(Category::optimizer)] = 12345;
  c.fits = true;
  const Candidate back = nlohmann::json::parse(nlohmann::json(c).dump()).get<Candidate>();
  EXPECT_EQ(back.ckpt, c.ckpt);
  EXPECT_EQ(back.act_compress, c.act_compress);
  EXPECT_EQ(back.offload, c.offload);
  EXPECT_EQ(back.offload_params, c.offload_params);
  EXPECT_EQ(back.offload_grads, c.offload_grads);
  EXPECT_EQ(back.batch, c.batch);
  EXPECT_EQ(back.grad_accum, c.grad_accum);
  EXPECT_EQ(back.zero, c.zero);
  EXPECT_EQ(back.peak_bytes, c.peak_bytes);
  EXPECT_EQ(back.peak_rank, c.peak_rank);
  EXPECT_EQ(back.est_step_seconds, c.est_step_seconds);
  EXPECT_EQ(back.by_category, c.by_category);
  EXPECT_EQ(back.fits, c.fits);
  nlohmann::json bad = nlohmann::json(c);
  bad["act_compress"] = "int4";
  EXPECT_THROW(bad.get<Candidate>(), ConfigError);
}

TEST(Search, PicksTheFastestThatFitsAndEveryFasterOneDoesNot) {
  for (const char* attention : {"plain", "flash"}) {
    SCOPED_TRACE(attention);
    const TrainConfig c = tiny(attention);
    const size_t none = plan(c, "none", 4, 2).peak_bytes, full = plan(c, "full", 4, 2).peak_bytes;
    ASSERT_GT(none, full);
    const size_t limit = full + (none - full) / 2;
    const SearchResult r = search_training(resolve_run(c), limit, {true, false});
    ASSERT_TRUE(r.fits) << r.message;
    EXPECT_LE(r.choice.peak_bytes, limit);
    EXPECT_NE(r.choice.ckpt, "none");
    EXPECT_NE(r.choice.ckpt, "full");  // the budget leaves room to keep some blocks
    // The choice as trainng would plan it.
    EXPECT_EQ(plan(c, r.choice.ckpt, 4, 2).peak_bytes, r.choice.peak_bytes);
    // Whatever the policy, anything faster than the choice does not fit, and anything as fast
    // that fits takes no less memory.
    for (const std::string& p : every_policy()) {
      const PlanReport q = plan(c, p, 4, 2);
      Candidate x;
      x.est_step_seconds = q.est_step_seconds;
      if (faster(x, r.choice)) {
        EXPECT_GT(q.peak_bytes, limit) << p << " is faster and fits";
      } else if (!faster(r.choice, x) && q.peak_bytes <= limit) {
        EXPECT_GE(q.peak_bytes, r.choice.peak_bytes) << p;
      }
    }
    // The runner-ups: fitting ones slower (or as fast and larger), the others over the limit.
    for (const Candidate& s : r.slower) EXPECT_TRUE(s.fits && !preferred(s, r.choice)) << s.ckpt;
    for (const Candidate& o : r.over) {
      EXPECT_GT(o.peak_bytes, limit) << o.ckpt;
      EXPECT_FALSE(faster(r.choice, o)) << o.ckpt;  // only the ones that would have won
    }
    EXPECT_FALSE(r.over.empty());  // none, at least, is faster and does not fit
    EXPECT_NE(r.message.find(r.choice.ckpt), std::string::npos) << r.message;
  }
}

TEST(Search, AutoBatchKeepsTheGlobalBatchAndPrefersTheSmallerFootprintAtEqualCost) {
  TrainConfig c = tiny("plain");
  c.batch = 8;
  c.grad_accum = 1;
  // A budget that --ckpt none fits at micro-batch 2 but not at 8, and --ckpt full fits at 8.
  const size_t limit = std::max(plan(c, "none", 2, 4).peak_bytes, plan(c, "full", 8, 1).peak_bytes);
  ASSERT_GT(plan(c, "none", 8, 1).peak_bytes, limit);
  const SearchResult r = search_training(resolve_run(c), limit, {true, true});
  ASSERT_TRUE(r.fits);
  for (const Candidate& x : r.candidates) EXPECT_EQ(x.batch * x.grad_accum, 8);
  EXPECT_EQ(r.candidates.size(), checkpoint_candidates(kLayers, AttentionKind::plain).size() * 4);
  // The micro-batches cost the same FLOPs: recomputing is slower than splitting the batch.
  EXPECT_EQ(r.choice.ckpt, "none");
  EXPECT_EQ(r.choice.batch, 1);  // as fast as 2, and smaller
  EXPECT_EQ(r.choice.grad_accum, 8);
  EXPECT_EQ(r.choice.peak_bytes, plan(c, "none", 1, 8).peak_bytes);
  EXPECT_LT(r.choice.peak_bytes, plan(c, "none", 2, 4).peak_bytes);
  for (const Candidate& x : r.slower)  // the other micro-batches of none: as fast, larger
    if (x.ckpt == "none") {
      EXPECT_FALSE(faster(r.choice, x)) << x.batch;
    }
  // Without --auto-batch the micro-batch stays 8 and a policy has to recompute.
  const SearchResult fixed = search_training(resolve_run(c), limit, {true, false});
  ASSERT_TRUE(fixed.fits);
  EXPECT_EQ(fixed.choice.batch, 8);
  EXPECT_NE(fixed.choice.ckpt, "none");
  EXPECT_TRUE(faster(r.choice, fixed.choice));
}

TEST(Search, NothingFitsReportsTheTrueMinimumAndWhatDominatesIt) {
  TrainConfig c = tiny("plain");
  // The true minimum over every policy and micro-batch, planned here independently.
  size_t least = SIZE_MAX;
  PlanReport least_plan;
  for (const std::string& p : every_policy())
    for (int b : {1, 2, 4, 8}) {
      const PlanReport q = plan(c, p, b, 8 / b);
      if (q.peak_bytes < least) {
        least = q.peak_bytes;
        least_plan = q;
      }
    }
  const size_t limit = least - 1;
  const SearchResult r = search_training(resolve_run(c), limit, {true, true});
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.smallest.peak_bytes, least);
  EXPECT_EQ(r.smallest.over(limit), 1u);
  size_t top = 0;
  for (Category k : kAllCategories) top = std::max(top, least_plan.by_category[size_t(k)]);
  EXPECT_EQ(r.smallest.dominant_bytes(), top);
  EXPECT_EQ(least_plan.by_category[size_t(r.smallest.dominant())], top);
  EXPECT_NE(r.message.find("nothing fits"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find(std::string(category_name(r.smallest.dominant()))), std::string::npos)
      << r.message;
  ASSERT_FALSE(r.over.empty());
  EXPECT_EQ(r.over.front().peak_bytes, least);  // nearest first

  // Training with --ckpt auto under that budget stops before anything is built, with the same
  // minimum in an out-of-memory error (exit 3 from the command). (--act-compress none: the
  // minimum above is over uncompressed runs.)
  c.act_compress = "none";
  c.ckpt = "auto";
  c.auto_batch = true;
  c.mem_limit = std::to_string(limit);
  try {
    resolve_auto(c);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), least);
    EXPECT_EQ(e.budget(), limit);
    EXPECT_NE(std::string(e.what()).find("smallest footprint"), std::string::npos) << e.what();
    EXPECT_FALSE(e.advice().empty());  // what else would fit (an 8-bit optimizer, bf16)
  }
}

TEST(Search, CompressionIsACandidateBesideThePoliciesUnlessGiven) {
  for (const char* attention : {"plain", "flash"}) {
    SCOPED_TRACE(attention);
    TrainConfig c = tiny(attention);
    c.ckpt = "auto";
    c.mem_limit = "1GiB";
    const RunSpec open = resolve_run(c);
    ASSERT_TRUE(SearchSpace::of(open).compression);
    auto peak = [&](const char* ckpt, const char* compress) {
      TrainConfig t = c;
      t.ckpt = ckpt;
      t.act_compress = compress;
      return plan_training(resolve_run(t));
    };
    const PlanReport none = peak("none", "none"), int8 = peak("none", "int8");
    ASSERT_LT(int8.peak_bytes, none.peak_bytes);
    EXPECT_GT(int8.est_step_seconds, none.est_step_seconds);  // the passes cost time
    // A budget that keeping every block fits compressed, not as it is.
    const size_t limit = int8.peak_bytes + (none.peak_bytes - int8.peak_bytes) / 2;
    const SearchResult r = search_training(open, limit, SearchSpace::of(open));
    ASSERT_TRUE(r.fits) << r.message;
    // Every policy uncompressed, and compressed where it keeps some block's activations.
    size_t keeping = 0;
    for (const std::string& p : checkpoint_candidates(kLayers, open.attention)) {
      const BlockSlots slots = block_slots(CheckpointPolicy::parse(p), kLayers);
      keeping += std::count(slots.slot.begin(), slots.slot.end(), -1) > 0;
    }
    EXPECT_EQ(r.candidates.size(), checkpoint_candidates(kLayers, open.attention).size() + keeping);
    for (const Candidate& x : r.candidates) {
      if (x.act_compress == ActCompress::none) continue;
      EXPECT_EQ(x.act_compress, kSearchCompress);
      EXPECT_NE(x.ckpt, "full");
      EXPECT_FALSE(x.ckpt.starts_with("every:")) << "every block recomputed: nothing to compress";
      // As training would plan it.
      EXPECT_EQ(x.peak_bytes, peak(x.ckpt.c_str(), "int8").peak_bytes) << x.ckpt;
    }
    // The fastest that fits, over policies and compression alike.
    for (const Candidate& x : r.candidates)
      if (faster(x, r.choice)) {
        EXPECT_FALSE(x.fits) << candidate_options(x, false);
      }
    const Candidate* compressed_none = nullptr;
    for (const Candidate& x : r.candidates)
      if (x.ckpt == "none" && x.act_compress != ActCompress::none) compressed_none = &x;
    ASSERT_NE(compressed_none, nullptr);
    EXPECT_TRUE(compressed_none->fits);
    if (r.choice.act_compress != ActCompress::none) {
      EXPECT_NE(r.message.find("--act-compress int8"), std::string::npos) << r.message;
    }
    // The choice, applied, is a run with nothing left to choose.
    const RunSpec chosen = apply_candidate(open, r.choice);
    EXPECT_EQ(chosen.act_compress, r.choice.act_compress);
    EXPECT_FALSE(chosen.act_compress_open);

    // --act-compress given: the search keeps it under every policy.
    for (const char* given : {"none", "fp8"}) {
      TrainConfig g = c;
      g.act_compress = given;
      const RunSpec fixed = resolve_run(g);
      const SearchResult f = search_training(fixed, limit, SearchSpace::of(fixed));
      EXPECT_EQ(f.candidates.size(), checkpoint_candidates(kLayers, open.attention).size());
      for (const Candidate& x : f.candidates)
        EXPECT_EQ(act_compress_name(x.act_compress), given) << x.ckpt;
    }
  }
}

// The search shares step plans between candidates (StepPlanCache): each candidate must still be
// what plan_training makes of its run alone, byte for byte and to the last bit of the estimate,
// over every axis at once (policies, compression, micro-batches, the optimizer, weights and
// gradients offloaded or not, and over two ranks every stage).
TEST(Search, EveryCandidateIsItsRunPlannedAlone) {
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    TrainConfig c = tiny("flash");
    c.ckpt = "auto";
    c.auto_batch = true;
    c.mem_limit = "1GiB";
    c.offload_dir = empty_dir() + "/offload";
    c.ranks = ranks;
    c.zero_auto = ranks > 1;
    const RunSpec open = resolve_run(c);
    const SearchSpace space = SearchSpace::of(open);
    ASSERT_TRUE(space.offload && space.micro_batches && space.compression);
    ASSERT_EQ(space.offload_grads, ranks == 1);
    ASSERT_EQ(space.stages, ranks > 1);
    const SearchResult r = search_training(open, size_t{1} << 30, space);
    ASSERT_GT(r.candidates.size(), 50u);
    for (const Candidate& x : r.candidates) {
      SCOPED_TRACE(candidate_options(x, true, true));
      const RunSpec run = apply_candidate(open, x);
      int rank = 0;
      const PlanReport alone = plan_largest_rank(run, &rank);
      EXPECT_EQ(x.peak_bytes, alone.peak_bytes);
      EXPECT_EQ(x.by_category, alone.by_category);
      EXPECT_EQ(x.peak_rank, rank);
      EXPECT_EQ(x.est_step_seconds, plan_training(run).est_step_seconds);
    }
  }
}

TEST(StepPlanCache, KeepsTheLastPlansByEverythingTheyDependOn) {
  ModelConfig m = ModelConfig::preset("gpt2-tiny");
  m.finalize();
  ActivationOptions none, full;
  full.ckpt = CheckpointPolicy::parse("full");
  auto activations = [](const StepPlan& p) {
    return p.arena[static_cast<size_t>(Category::activations)];
  };
  StepPlanCache cache;
  const StepPlan* first = &cache.plan(m, 2, 16, none);
  EXPECT_EQ(&cache.plan(m, 2, 16, none), first);  // kept: the same plan, not made again
  EXPECT_EQ(cache.made(), 1u);
  const size_t kept_all = activations(*first);  // read before the next call, as plan() allows
  EXPECT_LT(activations(cache.plan(m, 2, 16, full)), kept_all);
  EXPECT_EQ(cache.made(), 2u);
  // Every input is part of the key: B, T, the model, the thread count.
  cache.plan(m, 1, 16, none);
  cache.plan(m, 2, 8, none);
  EXPECT_EQ(cache.made(), 4u);
  ModelConfig wider = m;
  wider.d_model *= 2;
  wider.finalize();
  const size_t wide = activations(cache.plan(wider, 2, 16, none));
  EXPECT_GT(wide, activations(cache.plan(m, 2, 16, none)));
  EXPECT_EQ(cache.made(), 6u);  // m's first plan had been dropped: four are kept
  {
    const ScopedThreads other_threads(omp_get_max_threads() + 3);
    cache.plan(m, 2, 16, none);
  }
  EXPECT_EQ(cache.made(), 7u);
  // Each plan is plan_step's.
  const StepPlan made = plan_step(m, 2, 16, full);
  const StepPlan& kept = cache.plan(m, 2, 16, full);
  EXPECT_EQ(kept.arena, made.arena);
  EXPECT_EQ(kept.options, made.options);
  ASSERT_EQ(kept.buffers.size(), made.buffers.size());
  for (size_t i = 0; i < made.buffers.size(); ++i)
    EXPECT_EQ(kept.buffers[i].offset, made.buffers[i].offset) << made.buffers[i].tag;
}

TEST(Search, AutoWithoutMemLimitIsAConfigErrorNamingIt) {
  for (bool auto_batch : {false, true}) {
    TrainConfig c = tiny("flash");
    if (auto_batch)
      c.auto_batch = true;
    else
      c.ckpt = "auto";
    try {
      resolve_auto(c);
      ADD_FAILURE() << "expected ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--mem-limit"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(auto_batch ? "--auto-batch" : "--ckpt auto"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace memfit
