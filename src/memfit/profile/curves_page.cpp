#include "memfit/profile/curves_page.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/memory/category.h"
#include "memfit/profile/page_assets.h"
#include "memfit/profile/page_text.h"

namespace memfit::profile {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The numeric series of a step line, as the trainer writes them (train/trainer.cpp). Only
// "loss" is required; a missing one is a gap (null), as is a null (a skipped fp16 step's norm).
constexpr const char* kStepSeries[] = {"loss",       "lr",        "grad_norm",
                                       "tokens_per_s", "peak_bytes", "rss_bytes"};

// Where a line went wrong: "FILE:LINE".
std::string at(const fs::path& file, size_t line) { return fmt::format("{}:{}", file.string(), line); }

// The line's "step": a positive integer.
int64_t step_of(const json& j, const fs::path& file, size_t line) {
  const auto it = j.find("step");
  if (it == j.end())
    MEMFIT_THROW(ConfigError, "curves", "{}: a line with \"{}\" has no \"step\"", at(file, line),
                 j.contains("loss") ? "loss" : "val_loss");
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    MEMFIT_THROW(ConfigError, "curves", "{}: \"step\" must be an integer of 1 or more, got {}",
                 at(file, line), it->dump());
  return it->get<int64_t>();
}

// The value of `key` in a line: a number, or null where absent or null.
json number_of(const json& j, const char* key, const fs::path& file, size_t line) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  if (!it->is_number())
    MEMFIT_THROW(ConfigError, "curves", "{}: \"{}\" must be a number, got {}", at(file, line), key,
                 it->dump());
  return *it;
}

// The step's bytes by category ("mem"): an object of non-negative integers.
std::map<std::string, json> memory_of(const json& j, const fs::path& file, size_t line) {
  std::map<std::string, json> out;
  const auto it = j.find("mem");
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_object())
    MEMFIT_THROW(ConfigError, "curves", "{}: \"mem\" must be an object of bytes by category, got {}",
                 at(file, line), it->dump());
  for (const auto& [category, bytes] : it->items()) {
    if (!bytes.is_number_unsigned())
      MEMFIT_THROW(ConfigError, "curves", "{}: \"mem\".\"{}\" must be a byte count, got {}",
                   at(file, line), category, bytes.dump());
    out[category] = bytes;
  }
  return out;
}

// Categories in the pool's order (params first), then any other names the log holds.
std::vector<std::string> ordered_categories(const std::set<std::string>& seen) {
  std::vector<std::string> out;
  for (Category c : kAllCategories)
    if (seen.count(std::string(category_name(c)))) out.emplace_back(category_name(c));
  for (const std::string& c : seen)
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

}  // namespace

json read_training_log(const fs::path& file, const std::string& name) {
  std::ifstream in(file);
  if (!in) MEMFIT_THROW(IoError, "curves", "{}: cannot read the log", file.string());
  struct Step {
    json values;  // kStepSeries' values, by name
    std::map<std::string, json> mem;
  };
  std::map<int64_t, Step> steps;
  std::map<int64_t, json> val;
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      MEMFIT_THROW(ConfigError, "curves", "{}: not valid JSON ({}); is it a memfit train --log file?",
                   at(file, line), e.what());
    }
    if (!j.is_object())
      MEMFIT_THROW(ConfigError, "curves", "{}: a line must be a JSON object, got {}",
                   at(file, line), j.dump().substr(0, 80));
    if (j.contains("loss")) {
      Step s;
      const int64_t step = step_of(j, file, line);
      for (const char* key : kStepSeries) s.values[key] = number_of(j, key, file, line);
      s.mem = memory_of(j, file, line);
      steps[step] = std::move(s);
    }
    if (j.contains("val_loss")) {
      const int64_t step = step_of(j, file, line);
      val[step] = number_of(j, "val_loss", file, line);
    }
  }
  if (in.bad()) MEMFIT_THROW(IoError, "curves", "{}: read failed", file.string());
  if (steps.empty())
    MEMFIT_THROW(ConfigError, "curves",
                 "{}: no training steps (no line with \"step\" and \"loss\"); is it a memfit "
                 "train --log file?",
                 file.string());

  std::set<std::string> seen;
  for (const auto& [step, s] : steps)
    for (const auto& [c, bytes] : s.mem) seen.insert(c);
  const std::vector<std::string> categories = ordered_categories(seen);
  json run = {{"name", name}, {"path", file.string()}, {"step", json::array()}};
  for (const char* key : kStepSeries) run[key] = json::array();
  json mem = json::object();
  for (const std::string& c : categories) mem[c] = json::array();
  for (const auto& [step, s] : steps) {
    run["step"].push_back(step);
    for (const char* key : kStepSeries) run[key].push_back(s.values[key]);
    for (const std::string& c : categories) {
      const auto it = s.mem.find(c);
      mem[c].push_back(it == s.mem.end() ? json(0) : it->second);
    }
  }
  run["categories"] = categories;
  run["mem"] = std::move(mem);
  run["val_step"] = json::array();
  run["val_loss"] = json::array();
  for (const auto& [step, loss] : val) {
    run["val_step"].push_back(step);
    run["val_loss"].push_back(loss);
  }
  return run;
}

std::vector<std::string> run_names(const std::vector<std::string>& logs) {
  std::vector<std::string> names;
  for (const std::string& log : logs) names.push_back(fs::path(log).stem().string());
  for (size_t i = 0; i < names.size(); ++i)
    if (std::count(names.begin(), names.end(), names[i]) > 1)
      for (size_t k = 0; k < names.size(); ++k)
        if (fs::path(logs[k]).stem().string() == fs::path(logs[i]).stem().string())
          names[k] = logs[k];
  return names;
}

json curves_data(const std::vector<std::string>& logs) {
  MEMFIT_CHECK(!logs.empty(), "curves", "no log given");
  const std::vector<std::string> names = run_names(logs);
  json runs = json::array();
  std::string title;
  for (size_t i = 0; i < logs.size(); ++i) {
    runs.push_back(read_training_log(logs[i], names[i]));
    title += (i ? i + 1 == logs.size() ? " and " : ", " : "") + names[i];
  }
  return {{"title", "memfit training curves: " + title}, {"runs", std::move(runs)}};
}

std::string curves_page_html(const json& data) {
  return page_html(data.value("title", std::string("memfit training curves")), kCurvesPageCss,
                   R"(<h1 id="title"></h1>
<pre id="errors"></pre>
<div id="legend"></div>
<table id="runs"><thead><tr><th>run</th><th class="n">steps</th><th class="n">last loss</th>
<th class="n">last val loss</th><th class="n">median tokens/s</th><th class="n">peak MiB</th>
<th>log</th></tr></thead><tbody></tbody></table>
<div id="panels"></div>
<div id="tip"></div>
<p class="sub">memfit train --log writes this page beside its log; memfit curves A.jsonl B.jsonl
-o FILE overlays several runs. Memory is the pool's bytes by category at the end of each step,
with the pool's peak so far (dashed) and the process's resident memory (dotted).</p>
)",
                   data.dump(), kCurvesPageJs);
}

void write_curves_page(const std::vector<std::string>& logs, const fs::path& out) {
  const std::string html = curves_page_html(curves_data(logs));
  if (const fs::path parent = out.parent_path(); !parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec)
      MEMFIT_THROW(IoError, "curves", "{}: cannot create {}: {}", out.string(), parent.string(),
                   ec.message());
  }
  io::write_file_atomic(out, html);
}

fs::path curves_path_for_log(const fs::path& log) {
  fs::path page = log;
  page.replace_extension(".curves.html");
  return page;
}

}  // namespace memfit::profile
