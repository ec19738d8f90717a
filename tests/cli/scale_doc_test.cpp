// docs/scale.md plans the seed documents' configurations (7B on one 24 GB GPU, 70B on 8 x 80 GB,
// 405B over 128 ranks) with tables that scripts/scale_plans.sh writes from `memfit plan --json`.
// These tests rerun every plan that takes no search (the searches take seconds to minutes and
// their choice depends on this CPU's calibration), each with the command line the doc prints
// above its table, and check every figure of the table and of its collectives lines (the data
// group's, the tensor group's, the pipeline's transfers), so the doc
// cannot drift from the planner: when one fails, rerun `bash scripts/scale_plans.sh` and reread
// the prose beside the table.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit::test {
namespace {

namespace fs = std::filesystem;

const fs::path kDoc = fs::path(MEMFIT_SOURCE_DIR) / "docs" / "scale.md";
// The script pins the ISA cap (the workspace and the LM head's chunk depend on whether bf16
// GEMMs are native) so that every CPU plans the same bytes.
const std::string kPrefix = "`MEMFIT_MAX_ISA=avx512 memfit plan ";
const char* const kCategories[] = {"params",      "master",    "grads", "optimizer",
                                   "activations", "workspace", "comm",  "staging"};

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / (1024.0 * 1024 * 1024)); }

// scale_plans.sh's sizes in the tensor group's and the pipeline's lines: GiB from 1 GiB, else MiB.
std::string size(double bytes) {
  return bytes >= 1024.0 * 1024 * 1024 ? gib(bytes) + " GiB"
                                       : fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024));
}

// The figures of one tensor group's line (a stage's, or the run's), as the script writes them.
std::vector<std::string> tensor_figures(const nlohmann::json& t) {
  std::vector<std::string> f = {
      fmt::format("all-reduce {} in {}", size(t["all_reduce"].get<double>()),
                  t["all_reduce_count"].get<int64_t>()),
      fmt::format("gathers {} (the rank's parts)", size(t["gathered"].get<double>()))};
  if (t.contains("reduce_scatter"))
    f.push_back(fmt::format("reduce-scatter {} in {} (their inputs)",
                            size(t["reduce_scatter"].get<double>()),
                            t["reduce_scatter_count"].get<int64_t>()));
  return f;
}

// The block between the doc's markers for `name`, or "" when there is none.
std::string block_of(const std::string& doc, const std::string& name) {
  const std::string begin = "<!-- scale_plans " + name + " begin -->";
  const std::string end = "<!-- scale_plans " + name + " end -->";
  const size_t a = doc.find(begin), b = doc.find(end);
  if (a == std::string::npos || b == std::string::npos || b < a) return {};
  return doc.substr(a + begin.size(), b - a - begin.size());
}

// The table rows scale_plans.sh writes for a plan's JSON: one a run of consecutive ranks whose
// figures print the same.
std::vector<std::string> rows_of(const nlohmann::json& plan) {
  nlohmann::json ranks = plan.contains("per_rank") ? plan["per_rank"] : nlohmann::json::array();
  if (ranks.empty())
    ranks.push_back({{"rank", 0}, {"by_category", plan["by_category"]},
                     {"peak_bytes", plan["peak_bytes"]}});
  std::vector<std::string> rows;
  std::string last_figures;
  int first = 0, prev = 0;
  auto flush = [&] {
    if (last_figures.empty()) return;
    const std::string label =
        first == prev ? std::to_string(first) : fmt::format("{}-{}", first, prev);
    rows.push_back("| " + label + " |" + last_figures);
  };
  for (const auto& r : ranks) {
    std::string figures;
    for (const char* c : kCategories)
      figures += " " + gib(r["by_category"].value(c, 0.0)) + " |";
    figures += " " + gib(r["peak_bytes"].get<double>()) + " |";
    const int rank = r["rank"].get<int>();
    if (figures != last_figures) {
      flush();
      first = rank;
      last_figures = figures;
    }
    prev = rank;
  }
  flush();
  return rows;
}

// The rank rows of a block's table ("| 0 |", "| 0-7 |", ...).
size_t table_rows(const std::string& block) {
  size_t n = 0;
  for (size_t at = block.find("\n| "); at != std::string::npos; at = block.find("\n| ", at + 1))
    n += std::isdigit(static_cast<unsigned char>(block[at + 3])) ? 1 : 0;
  return n;
}

class ScaleDoc : public BinaryTest {
 protected:
  ScaleDoc() : BinaryTest(43) {}

  // Reruns the plan named `name` in docs/scale.md with --json and checks the doc's figures.
  void check(const std::string& name) {
    const std::string block = block_of(slurp(kDoc), name);
    ASSERT_FALSE(block.empty()) << "docs/scale.md has no plan " << name;
    const size_t at = block.find(kPrefix);
    ASSERT_NE(at, std::string::npos) << name << ": no command line in\n" << block;
    const size_t from = at + kPrefix.size();
    const std::string args = block.substr(from, block.find('`', from) - from);
    const Output run = memfit("plan " + args + " --json", "MEMFIT_MAX_ISA=avx512");
    ASSERT_EQ(run.exit_code, 0) << args << "\n" << run.err;
    const auto plan = nlohmann::json::parse(run.out);
    const std::string regenerate = "; rerun `bash scripts/scale_plans.sh` and reread the prose";
    const std::vector<std::string> rows = rows_of(plan);
    EXPECT_EQ(table_rows(block), rows.size())
        << "docs/scale.md's " << name << " has another number of rank rows" << regenerate;
    for (const std::string& row : rows)
      EXPECT_NE(block.find("\n" + row + "\n"), std::string::npos)
          << "docs/scale.md's " << name << " lacks the row memfit plans now:\n"
          << row << "\nin\n" << block << regenerate;
    if (plan.contains("comm_per_step")) {
      const auto& c = plan["comm_per_step"];
      const std::string line = fmt::format(
          "all-reduce {}, reduce-scatter {}, all-gather {} ({:.2f} x",
          gib(c["all_reduce"].get<double>()), gib(c["reduce_scatter"].get<double>()),
          gib(c["all_gather"].get<double>()), c["psi_multiple"].get<double>());
      EXPECT_NE(block.find(line), std::string::npos)
          << "docs/scale.md's " << name << " lacks: " << line << regenerate;
    }
    // The tensor group's collectives (each stage's under --pp) and the pipeline's transfers.
    std::vector<std::string> lines;
    if (plan.contains("stages")) {
      for (const auto& st : plan["stages"])
        if (st.contains("tensor_comm_per_step"))
          for (const std::string& f : tensor_figures(st["tensor_comm_per_step"]))
            lines.push_back(f);
    } else if (plan.contains("tensor_comm_per_step")) {
      lines = tensor_figures(plan["tensor_comm_per_step"]);
    }
    if (plan.contains("pipeline_time")) {
      const auto& t = plan["pipeline_time"];
      lines.push_back(fmt::format("{} each way at each cut ({} a micro-batch); the bubble {:.3f}",
                                  size(t["p2p_bytes_per_step"].get<double>()),
                                  size(t["p2p_bytes"].get<double>()),
                                  t["bubble_fraction"].get<double>()));
    }
    for (const std::string& line : lines)
      EXPECT_NE(block.find(line), std::string::npos)
          << "docs/scale.md's " << name << " lacks: " << line << regenerate;
    const std::string phase = "Peak at: " + plan["peak_phase"].get<std::string>() + ".";
    EXPECT_NE(block.find(phase), std::string::npos) << name << ": " << phase << regenerate;
  }
};

TEST_F(ScaleDoc, SevenBOnOneGpuAsTheSeedsGiveIt) { check("7b-given"); }

TEST_F(ScaleDoc, SevenBInPureBf16) { check("7b-pure"); }

TEST_F(ScaleDoc, SeventyBOnEightRanksAsTheSeedsGiveIt) { check("70b-given"); }

TEST_F(ScaleDoc, SeventyBOnEightRanksWithThePrecisionLevers) { check("70b-levers"); }

// The 405B over 128 data ranks, at ZeRO 3 with and without the levers and at ZeRO 1.
TEST_F(ScaleDoc, FourHundredFiveBOver128DataRanks) {
  check("405b-zero3");
  check("405b-zero3-levers");
  check("405b-zero1");
}

// What memfit plans of torchtitan's layouts: their FSDP dimension alone, as ZeRO 3.
TEST_F(ScaleDoc, TorchtitansLayoutsAsDataRanksAlone) {
  check("70b-zero3-256");
  check("405b-zero3-512");
}

// The layouts with the tensor and pipeline split: torchtitan's 70B (FSDP 32 x TP 8, 16
// sequences a data rank) and the seed's 405B (tp 8, pp 4, dp 4, ZeRO 1), every rank's bytes.
TEST_F(ScaleDoc, TensorAndPipelineLayouts) {
  check("70b-torchtitan");
  check("405b-3d");
}

// The seed's 405B layout in its fp8: the linears stored as E4M3 codes on every stage and tensor
// rank (Note [FP8], "Under --tp and --pp"), params about half of 405b-3d's.
TEST_F(ScaleDoc, TheSeedsLayoutInFp8StoresTheCodes) { check("405b-3d-fp8"); }

// The rows are checked as the script prints them: a run of equal ranks is one row.
TEST(ScaleDocRows, ConsecutiveEqualRanksShareARow) {
  const nlohmann::json by = {{"params", 1073741824.0}};
  const nlohmann::json other = {{"params", 2147483648.0}};
  const nlohmann::json plan = {
      {"per_rank",
       {{{"rank", 0}, {"by_category", by}, {"peak_bytes", 1073741824.0}},
        {{"rank", 1}, {"by_category", by}, {"peak_bytes", 1073741824.0}},
        {{"rank", 2}, {"by_category", other}, {"peak_bytes", 2147483648.0}}}}};
  const auto rows = rows_of(plan);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], "| 0-1 | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 1.00 |");
  EXPECT_EQ(rows[1], "| 2 | 2.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 2.00 |");
}

}  // namespace
}  // namespace memfit::test
