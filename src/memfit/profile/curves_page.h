// curves.html: the training logs of `memfit train --log` as one self-contained page that opens
// offline, in the style of memory.html: the loss and validation loss, the learning rate, the
// gradient norm and the tokens per second over the steps, one line per run (several runs
// overlaid), and each run's memory by category over the steps as a stacked area with its peak.
// `memfit train --log FILE` writes it beside the log; `memfit curves A.jsonl B.jsonl -o F`
// compares runs. The drawing is the project's own small script (page/curves_page.js), compiled
// in; the data is a JSON block in the page. See docs/notes/training-curves.md.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memfit::profile {

// One run's series from its JSON-lines log: the step lines (loss, lr, grad_norm, tokens_per_s,
// peak_bytes, rss_bytes, mem by category), the validation lines (val_loss), sorted by step, a
// later line for the same step replacing an earlier one; other lines (saves, ZeRO's per-rank
// peaks) are skipped. IoError when the file cannot be read; ConfigError naming "FILE:LINE" for a
// line that is not a JSON object or a field of the wrong type, and naming the file when it holds
// no step at all.
nlohmann::json read_training_log(const std::filesystem::path& file, const std::string& name);

// The runs' names: each log's file name without its extension, or where two of those are equal,
// the paths as given.
std::vector<std::string> run_names(const std::vector<std::string>& logs);

// The page's data for these logs, in order (at least one).
nlohmann::json curves_data(const std::vector<std::string>& logs);

// The whole page for that data.
std::string curves_page_html(const nlohmann::json& data);

// Reads the logs and writes their page to `out` (atomically), creating its directory.
void write_curves_page(const std::vector<std::string>& logs, const std::filesystem::path& out);

// Where `memfit train --log LOG` writes its page: beside the log, its extension replaced by
// ".curves.html" (out/brown.jsonl -> out/brown.curves.html).
std::filesystem::path curves_path_for_log(const std::filesystem::path& log);

}  // namespace memfit::profile
