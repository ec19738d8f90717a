// profile-diff: tags grouped across blocks, two summaries compared by category and by buffer
// group (largest change first), and the refusals of a missing or foreign summary.
#include "memfit/profile/profile_diff.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "memfit/core/error.h"
#include "memfit/profile/profile_summary.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json summary(double activations, const std::vector<std::pair<std::string, double>>& buffers) {
  json b = json::array();
  for (const auto& [tag, bytes] : buffers)
    b.push_back({{"tag", tag}, {"category", "activations"}, {"bytes", bytes}, {"in_arena", true},
                 {"live_at_peak", true}, {"lifetime", "x"}});
  return {{"version", profile::kSummaryVersion},
          {"run", {{"model", "gpt2"}, {"ckpt", "none"}}},
          {"measured", {{"peak_bytes", 1000 + activations},
                        {"by_category", {{"params", 1000}, {"activations", activations}}}}},
          {"live_peak", {{"bytes", 1000 + activations}, {"where", "LM head"},
                         {"by_category", {{"params", 1000}, {"activations", activations}}}}},
          {"shares", {{"at_live_peak", {{"activations_pct", 10.0}, {"activations_over_params", 0.1}}}}},
          {"phases", json::array({{{"kind", "forward"}, {"live_bytes", 1000 + activations}}})},
          {"buffers", b}};
}

TEST(ProfileDiff, ComparesCategoriesAndBufferGroups) {
  const json a = summary(300, {{"h.0.fch", 100}, {"h.1.fch", 100}, {"encoded", 100}});
  const json b = summary(150, {{"rc.0.fch", 50}, {"h.1.residual_3", 10}, {"encoded", 100}});
  const json d = profile::profile_diff_json(a, b);
  ASSERT_EQ(d["categories"].size(), 2u);
  EXPECT_EQ(d["categories"][1]["category"], "activations");
  EXPECT_EQ(d["categories"][1]["change"], -150.0);
  // encoded did not change; h.*.fch went, rc.*.fch and h.*.residual_3 came.
  ASSERT_EQ(d["buffers"].size(), 3u);
  EXPECT_EQ(d["buffers"][0]["group"], "h.*.fch");
  EXPECT_EQ(d["buffers"][0]["a_count"], 2);
  EXPECT_EQ(d["buffers"][0]["b_count"], 0);
  EXPECT_EQ(d["buffers"][1]["group"], "rc.*.fch");
  const std::string text = profile::profile_diff_text(d, "A", "B", 2);
  for (const char* part : {"activations", "h.*.fch", "rc.*.fch", "and 1 more", "-0.0"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " not in:\n" << text;
}

TEST(ProfileDiff, LoadsFromADirectoryOrARankDirectoryAndRefusesOthers) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("memfit_profile_diff_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "mpi" / "rank1");
  std::ofstream(dir / "mpi" / "rank1" / "summary.json") << summary(1, {}).dump();
  EXPECT_EQ(profile::load_summary(dir / "mpi", 1)["version"], profile::kSummaryVersion);
  EXPECT_THROW(profile::load_summary(dir / "mpi", 0), IoError);
  EXPECT_THROW(profile::load_summary(dir / "nowhere"), IoError);
  std::ofstream(dir / "old.json") << R"({"version": 99})";
  try {
    profile::load_summary(dir / "old.json");
    ADD_FAILURE() << "a version 99 summary was read";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("old.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "junk.json") << "not json";
  EXPECT_THROW(profile::load_summary(dir / "junk.json"), ConfigError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memfit
