// summary.json and the printed summary: measured and planned peaks by category, the live peak
// with its buffers (the top 20 in order, all buffers of the plan listed once), the live bytes of
// each phase against the plan's, and the shares.
#include "memfit/profile/profile_summary.h"

#include <gtest/gtest.h>

#include <set>

#include "profile_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;
using profile_test::RecordedRun;

struct Summarised {
  RecordedRun run{Family::gpt2, "full"};
  PlanReport plan;
  json summary;
  Summarised() {
    const auto events = run.pool.events();
    const auto tl = profile::build_timeline(*run.recorder, events, run.begin, run.end);
    // The plan as the planner would give it for this pool: the same step plan, the slabs the
    // run allocated outside the arenas (the test's batch is staging).
    plan.step = run.model->step_plan();
    plan.by_category = run.pool.peak_breakdown();
    for (size_t b : plan.by_category) plan.peak_bytes += b;
    profile::SummaryInputs in;
    in.run = {{"model", "odd"}, {"ckpt", "full"}};
    in.plan = &plan;
    in.peak_by_category = run.pool.peak_breakdown();
    in.events = events.size();
    summary = profile::summary_json(*run.recorder, tl, in);
  }
};

TEST(ProfileSummary, ReportsPeaksBuffersAndPhases) {
  Summarised s;
  const json& j = s.summary;
  EXPECT_EQ(j["version"], profile::kSummaryVersion);
  EXPECT_EQ(j["measured"]["peak_bytes"], s.run.pool.bytes_peak());
  EXPECT_EQ(j["planned"]["peak_bytes"], s.plan.peak_bytes);
  EXPECT_LE(j["top_buffers"].size(), profile::kTopBuffers);
  size_t live = 0;
  std::set<std::string> tags;
  for (const json& b : j["buffers"]) {
    if (b["in_arena"]) { EXPECT_TRUE(tags.insert(b["tag"]).second) << b["tag"] << " listed twice"; }
    if (b["live_at_peak"]) live += b["bytes"].get<size_t>();
  }
  EXPECT_EQ(live, j["live_peak"]["bytes"].get<size_t>());
  EXPECT_EQ(tags.size(), s.plan.step.buffers.size());
  // Each phase ran once in training, with the plan's live bytes.
  ASSERT_EQ(j["phases"].size(), s.plan.step.phases.size());
  for (const json& p : j["phases"]) {
    EXPECT_EQ(p["runs"], 1) << p["name"];
    EXPECT_EQ(p["live_bytes"], p["planned_live_bytes"]) << p["name"];
  }
  EXPECT_EQ(j["slices"]["evaluation"]["count"], 1);
  // The groups add up to the live peak while there are at most kTopGroups of them.
  size_t grouped = 0;
  for (const json& g : j["top_groups"]) grouped += g["bytes"].get<size_t>();
  if (j["top_groups"].size() < profile::kTopGroups) { EXPECT_EQ(grouped, live); }
  EXPECT_LE(j["top_groups"].size(), profile::kTopGroups);
  const json& sh = j["shares"]["at_live_peak"];
  double total = 0;
  for (const char* k : {"activations_pct", "workspace_pct", "params_pct", "grads_pct",
                        "optimizer_pct", "other_pct"})
    total += sh[k].get<double>();
  EXPECT_NEAR(total, 100.0, 1e-9);
}

TEST(ProfileSummary, GroupsTagsAcrossBlocks) {
  EXPECT_EQ(profile::tag_group("h.11.fch"), "h.*.fch");
  EXPECT_EQ(profile::tag_group("rc.0.attn.lse"), "rc.*.attn.lse");
  EXPECT_EQ(profile::tag_group("ws.logits"), "ws.logits");
  EXPECT_EQ(profile::tag_group("encoded"), "encoded");
  EXPECT_EQ(profile::tag_group("h.2.residual_3"), "h.*.residual_3");
}

TEST(ProfileSummary, TextNamesThePeakTheTopBuffersAndThePhases) {
  Summarised s;
  const std::string text = profile::summary_text(s.summary, "DIR");
  for (const char* part : {"memfit profile: DIR", "measured by the pool", "planned", "top ",
                           "buffers live then", "the same by group", "live bytes per phase", "recompute (2 blocks)",
                           "activations", "x the parameters", "resident outside the pool"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " not in:\n" << text;
  EXPECT_NE(text.find(s.summary["top_buffers"][0]["tag"].get<std::string>()), std::string::npos);
}

TEST(ProfileSummary, WithoutAPlanSaysSo) {
  RecordedRun run;
  const auto tl = profile::build_timeline(*run.recorder, run.pool.events(), run.begin, run.end);
  profile::SummaryInputs in;
  const json j = profile::summary_json(*run.recorder, tl, in);
  EXPECT_TRUE(j["planned"].is_null());
  EXPECT_FALSE(j["phases"][0].contains("planned_live_bytes"));
  EXPECT_NE(profile::summary_text(j, "DIR").find(" - "), std::string::npos);
}

}  // namespace
}  // namespace memfit
