// The fixture of the --pp tests that run the built binary under mpirun (pipeline_precision_test,
// pipeline_tied_test): a tiny model of four blocks, its logs read back, and the comparisons
// with one process (the same bits, or within a stated relative tolerance) and with the plan
// (every world rank's measured peak, by category). Skips where memfit was built without MPI.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit::test {

class PipelineBinaryTest : public MpiBinaryTest {
 protected:
  using json = nlohmann::json;
  explicit PipelineBinaryTest(uint32_t seed) : MpiBinaryTest(seed) {}

  // The run's options: LLaMA tiny unless `more` names a model; four blocks unless it gives
  // --n-layer, 32 tokens, batch 2.
  std::string args(const std::string& more) const {
    const bool model = more.find("--model") != std::string::npos;
    const bool layers = more.find("--n-layer") != std::string::npos;
    return fmt::format("{}{}--seq-len 32 --batch 2 --threads 1 --data '{}' {}",
                       model ? "" : "--model llama-tiny ", layers ? "" : "--n-layer 4 ",
                       (dir / "data").string(), more);
  }
  std::vector<json> lines(const std::filesystem::path& log) const {
    std::vector<json> out;
    std::istringstream in(slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // `memfit train more` under `ranks` ranks (0: one process); its log.
  std::vector<json> train(int ranks, const std::string& more, const std::string& name) const {
    const std::filesystem::path log = dir / (name + ".jsonl");
    EXPECT_EQ(run_memfit("train " + args(more) + fmt::format(" --log '{}'", log.string()), ranks),
              0)
        << name << ": " << slurp(dir / "err.txt");
    return lines(log);
  }
  // The lines of steps and evaluations (a run over several ranks logs their peaks too).
  static std::vector<json> numbers(const std::vector<json>& log) {
    std::vector<json> out;
    for (const json& j : log)
      if (j.contains("loss") || j.contains("val_loss")) out.push_back(j);
    return out;
  }
  // Every step's and evaluation's `keys` of `got` against `ref`: within `rel` of each other
  // relative to ref's (0: the same bits; a boolean as 0 or 1), at least `least` numbers in all.
  static void expect_close(const std::vector<json>& ref_log, const std::vector<json>& got_log,
                           const std::vector<const char*>& keys, double rel,
                           const std::string& what, int least = 8) {
    const std::vector<json> ref = numbers(ref_log), got = numbers(got_log);
    EXPECT_EQ(ref.size(), got.size()) << what;
    int compared = 0;
    for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i)
      for (const char* key : keys)
        if (ref[i].contains(key) && !ref[i][key].is_null()) {
          ASSERT_TRUE(got[i].contains(key)) << what << ": " << key << " at line " << i;
          auto value = [](const json& j) {
            return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
          };
          const double a = value(ref[i][key]), b = value(got[i][key]);
          if (rel == 0)
            EXPECT_EQ(a, b) << what << ": " << key << " at line " << i;
          else
            EXPECT_LE(std::abs(a - b), rel * std::abs(a))
                << what << ": " << key << " at line " << i;
          ++compared;
        }
    EXPECT_GE(compared, least) << what;
  }
  // `memfit plan` of `more` over `ranks` ranks is every world rank's measured peak, by
  // category (world rank q = (data rank x pp + stage) x tp + tensor); returns the plan's JSON.
  json expect_plan_is_measured(int ranks, const std::string& more) {
    const std::string a = args(more);
    EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size {} --json", a, ranks)), 0)
        << more << ": " << slurp(dir / "err.txt");
    const json plan = json::parse(slurp(dir / "out.txt"));
    const int P = plan["pp"].get<int>();
    int TP = 1;  // world rank q = (data x pp + stage) x tp + tensor
    for (const json& p : plan["per_rank"]) TP = std::max(TP, p.value("tensor_rank", 0) + 1);
    EXPECT_EQ(plan["per_rank"].size(), size_t(ranks)) << more;
    const auto log = train(ranks, more, "plan");
    json measured;
    for (const json& j : log)
      if (j.contains("ranks")) measured = j["ranks"];
    EXPECT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log: " << more;
    for (int q = 0; q < ranks && q < int(measured.size()) && q < int(plan["per_rank"].size());
         ++q) {
      const json& p = plan["per_rank"][q];
      EXPECT_EQ(p["stage"], (q / TP) % P);
      EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << more << ", rank " << q;
      for (const char* c : {"params", "master", "grads", "optimizer", "activations",
                            "workspace", "comm", "staging"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
    return plan;
  }
};

}  // namespace memfit::test
