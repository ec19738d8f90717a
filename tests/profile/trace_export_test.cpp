// trace.json's shape (docs/profiling.md): Chrome Trace Event objects with the fields each kind
// needs, a counter per category whose pool.total maximum is the pool's peak exactly, a slice for
// every phase of the step plan, allocation events with their tags, buffer slices in process 2.
#include "memfit/profile/trace_export.h"

#include <gtest/gtest.h>

#include <set>

#include "profile_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;
using profile_test::RecordedRun;

TEST(TraceExport, HasTheDocumentedShape) {
  RecordedRun run(Family::llama, "full");
  const auto events = run.pool.events();
  const auto tl = profile::build_timeline(*run.recorder, events, run.begin, run.end);
  const json trace = json::parse(profile::trace_json(*run.recorder, events, tl, 0).dump());
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  EXPECT_EQ(trace["otherData"]["measured_peak_bytes"], run.pool.bytes_peak());

  size_t total_max = 0;
  std::set<std::string> counters, phases, allocs;
  int buffer_slices = 0;
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    const std::string ph = e["ph"];
    if (ph != "M") { ASSERT_TRUE(e["ts"].is_number()) << e.dump(); }
    if (ph == "C") {
      counters.insert(e["name"]);
      ASSERT_TRUE(e["args"]["bytes"].is_number_unsigned()) << e.dump();
      if (e["name"] == "pool.total") total_max = std::max(total_max, e["args"]["bytes"].get<size_t>());
    } else if (ph == "X") {
      ASSERT_TRUE(e["dur"].is_number() && e["dur"].get<double>() >= 0) << e.dump();
      if (e["cat"] == "phase") phases.insert(e["name"]);
      if (e["pid"] == 2) ++buffer_slices;
    } else if (ph == "i") {
      allocs.insert(e["args"]["tag"].get<std::string>());
      EXPECT_TRUE(e["cat"] == "alloc" || e["cat"] == "free");
    } else {
      EXPECT_EQ(ph, "M");
    }
  }
  EXPECT_EQ(total_max, run.pool.bytes_peak());
  for (const char* c : {"pool.params", "pool.grads", "pool.activations", "pool.workspace",
                        "pool.total", "live.activations", "live.workspace", "live.total"})
    EXPECT_TRUE(counters.count(c)) << c;
  for (const Phase& p : run.model->step_plan().phases) EXPECT_TRUE(phases.count(p.name())) << p.name();
  for (const char* tag : {"params", "grads", "activations arena", "workspace arena"})
    EXPECT_TRUE(allocs.count(tag)) << tag;
  EXPECT_EQ(buffer_slices, static_cast<int>(run.recorder->spans().size()));
}

}  // namespace
}  // namespace memfit
