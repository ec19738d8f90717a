// `memfit prepare` as a library function: check, tokenize, split, write. See prepare.h.
#include "memfit/io/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/data/brown_corpus.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/io/data/loss_mask.h"
#include "memfit/io/data/prepare_chat.h"
#include "memfit/io/data/token_shard.h"
#include "memfit/io/tokenizer/tokenizer.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One document to read: a text file, or a Brown corpus file id.
struct Source {
  fs::path path;
  std::string brown_id;  // empty for a text file
};

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MEMFIT_THROW(IoError, "prepare", "cannot open input {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) MEMFIT_THROW(IoError, "prepare", "cannot read input {}", path.string());
  return std::move(text).str();
}

std::vector<Source> resolve_inputs(const PrepareOptions& o) {
  std::vector<Source> sources;
  for (const auto& input : o.inputs) {
    if (input == "brown") {
      fs::path dir = o.brown_dir.empty() ? find_brown_corpus_dir() : o.brown_dir;
      for (auto& id : brown_file_ids(dir)) sources.push_back({dir, id});
      continue;
    }
    std::error_code ec;
    fs::path path(input);
    if (!fs::exists(path, ec))
      MEMFIT_THROW(IoError, "prepare", "input {} not found", input);
    if (!fs::is_regular_file(path, ec))
      MEMFIT_THROW(IoError, "prepare", "input {} is not a regular file; pass text files", input);
    sources.push_back({path, ""});
  }
  return sources;
}

// Files written so far; removed again unless commit() is called.
class WrittenFiles {
 public:
  explicit WrittenFiles(fs::path created_dir) : created_dir_(std::move(created_dir)) {}
  ~WrittenFiles() {
    if (committed_) return;
    std::error_code ec;
    for (const auto& f : files_) fs::remove(f, ec);
    if (!created_dir_.empty()) fs::remove(created_dir_, ec);  // only if empty
  }
  void add(const fs::path& f) { files_.push_back(f); }
  void commit() { committed_ = true; }

 private:
  fs::path created_dir_;
  std::vector<fs::path> files_;
  bool committed_ = false;
};

}  // namespace

ValSplit choose_val_split(std::span<const int64_t> doc_starts, int64_t num_tokens,
                          double fraction) {
  if (fraction == 0) return {num_tokens, true};
  if (num_tokens < 2)
    MEMFIT_THROW(ConfigError, "prepare", "{} token(s) are too few to split off a validation "
                 "fraction of {}; use --val-fraction 0 or more text", num_tokens, fraction);
  const double want = fraction * static_cast<double>(num_tokens);
  const double target = static_cast<double>(num_tokens) - want;
  int64_t best = -1;
  for (int64_t s : doc_starts) {
    if (s <= 0 || s >= num_tokens) continue;
    if (best < 0 || std::abs(static_cast<double>(s) - target) <
                        std::abs(static_cast<double>(best) - target))
      best = s;
  }
  if (best > 0) {
    const double val = static_cast<double>(num_tokens - best);
    if (val >= want / 2 && val <= want * 2) return {best, true};
  }
  const int64_t val = std::min(num_tokens - 1, std::max<int64_t>(1, std::llround(want)));
  return {num_tokens - val, false};
}

std::optional<DatasetInfo> read_dataset_info(const fs::path& dir) {
  const fs::path file = dir / kDatasetInfoFile;
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  DatasetInfo info;
  try {
    const json j = json::parse(read_file_to_string(file));
    info.tokenizer = j.at("tokenizer").get<std::string>();
    info.vocab_size = j.at("vocab_size").get<int32_t>();
    info.eot_token = j.at("eot_token").get<int32_t>();
    info.token_bytes = j.at("token_bytes").get<int32_t>();
    info.documents = j.value("documents", int64_t{0});
    info.train_tokens = j.value("train_tokens", int64_t{0});
    info.val_tokens = j.value("val_tokens", int64_t{0});
    info.format = j.value("format", std::string("text"));
    info.chat_template = j.value("template", std::string());
    info.window = j.value("window", int64_t{0});
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "prepare", "{} is malformed: {}", file.string(), e.what());
  }
  if (info.token_bytes != 2 && info.token_bytes != 4)
    MEMFIT_THROW(IoError, "prepare", "{}: token_bytes is {}, expected 2 or 4", file.string(),
                 info.token_bytes);
  return info;
}

PrepareSummary prepare_dataset(const PrepareOptions& o, const PrepareProgress& progress) {
  // Check everything that can be checked before reading or writing anything.
  if (o.inputs.empty())
    MEMFIT_THROW(ConfigError, "prepare", "no input: pass --input FILE... (or --input brown)");
  if (o.out_dir.empty()) MEMFIT_THROW(ConfigError, "prepare", "no output folder: pass --out DIR");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1))
    MEMFIT_THROW(ConfigError, "prepare", "validation fraction must be in [0, 1), got {}",
                 o.val_fraction);
  if (o.shard_tokens <= 0)
    MEMFIT_THROW(ConfigError, "prepare", "tokens per shard must be positive, got {}",
                 o.shard_tokens);
  if (o.format != "text" && o.format != "chat" && o.format != "instruct")
    MEMFIT_THROW(ConfigError, "prepare", "unknown format '{}'; expected text, chat or instruct",
                 o.format);
  const bool chat = o.format != "text";
  if (chat && o.window < 2)
    MEMFIT_THROW(ConfigError, "prepare", "--format {} pads every record to one window: pass "
                 "--seq-len T (at least 2), the --seq-len you will train with", o.format);
  if (chat && std::find(o.inputs.begin(), o.inputs.end(), "brown") != o.inputs.end())
    MEMFIT_THROW(ConfigError, "prepare", "--format {} reads JSONL files of records; brown is "
                 "text (use --format text)", o.format);
  std::vector<Source> sources = resolve_inputs(o);
  std::error_code ec;
  const bool out_exists = fs::exists(o.out_dir, ec);
  if (out_exists && !fs::is_directory(o.out_dir, ec))
    MEMFIT_THROW(IoError, "prepare", "output {} exists and is not a folder", o.out_dir.string());
  std::vector<fs::path> stale;
  if (out_exists) {
    stale = find_token_shards(o.out_dir, "train");
    for (auto& f : find_token_shards(o.out_dir, "val")) stale.push_back(f);
  }
  if (!stale.empty() && !o.overwrite)
    MEMFIT_THROW(ConfigError, "prepare",
                 "{} already holds {} shard file(s) ({} ...); pass --overwrite to replace them",
                 o.out_dir.string(), stale.size(), stale.front().filename().string());
  auto tokenizer = make_tokenizer(o.tokenizer, o.vocab_dir);

  PrepareSummary summary;
  summary.tokenizer = std::string(tokenizer->name());
  summary.vocab_size = tokenizer->vocab_size();
  summary.eot_token = tokenizer->eot_token();
  summary.token_bytes = shard_token_bytes_for_vocab(summary.vocab_size);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // chat and instruct: one byte per token
  ValSplit split;
  if (chat) {
    ChatTokens c = tokenize_chat_records(o, *tokenizer, progress);
    tokens = std::move(c.tokens);
    mask = std::move(c.mask);
    split = {c.val_begin, true};
    summary.documents = summary.records = c.records;
    summary.records_truncated = c.truncated;
    summary.records_dropped = c.dropped;
    summary.train_masked = c.train_masked;
    summary.val_masked = c.val_masked;
    summary.chat_template = c.template_name;
    summary.window = o.window;
  } else {
    // Tokenize: [eot] + tokens for every non-empty document.
    std::vector<int64_t> doc_starts;
    std::vector<int32_t> ids;
    int64_t text_bytes = 0;
    for (size_t i = 0; i < sources.size(); ++i) {
      const Source& src = sources[i];
      std::string text = src.brown_id.empty() ? read_text_file(src.path)
                                              : read_brown_document(src.path, src.brown_id).text;
      text_bytes += static_cast<int64_t>(text.size());
      if (!text.empty()) {
        doc_starts.push_back(static_cast<int64_t>(tokens.size()));
        ids.assign(1, tokenizer->eot_token());
        tokenizer->encode_append(text, ids);
        tokens.insert(tokens.end(), ids.begin(), ids.end());
      }
      if (progress) progress(static_cast<int64_t>(i + 1), static_cast<int64_t>(sources.size()),
                             static_cast<int64_t>(tokens.size()));
    }
    if (text_bytes == 0)
      MEMFIT_THROW(IoError, "prepare", "the input is empty: {} file(s), no text (first: {})",
                   sources.size(), o.inputs.front());
    summary.documents = static_cast<int64_t>(doc_starts.size());
    split = choose_val_split(doc_starts, static_cast<int64_t>(tokens.size()), o.val_fraction);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  summary.train_tokens = split.begin;
  summary.val_tokens = n - split.begin;
  summary.val_at_document_boundary = split.at_document_boundary;

  // Write; on any failure the destructor of `written` removes what this run wrote.
  fs::path created;
  if (!out_exists) {
    fs::create_directories(o.out_dir, ec);
    if (ec)
      MEMFIT_THROW(IoError, "prepare", "cannot create {}: {}", o.out_dir.string(), ec.message());
    created = o.out_dir;
  }
  WrittenFiles written(created);
  auto write_split = [&](std::string_view name, int64_t begin, int64_t end,
                         std::vector<fs::path>& files) {
    for (int64_t at = begin, index = 0; at < end; at += o.shard_tokens, ++index) {
      fs::path path = o.out_dir / fmt::format("{}_{:06d}.bin", name, index);
      const int64_t count = std::min(o.shard_tokens, end - at);
      write_token_shard(path, {tokens.data() + at, static_cast<size_t>(count)},
                        summary.token_bytes);
      written.add(path);
      files.push_back(path);
      if (chat) {
        write_loss_mask(loss_mask_path(path), {mask.data() + at, static_cast<size_t>(count)});
        written.add(loss_mask_path(path));
      }
    }
  };
  write_split("train", 0, split.begin, summary.train_files);
  write_split("val", split.begin, n, summary.val_files);
  json info = {{"tokenizer", summary.tokenizer},     {"vocab_size", summary.vocab_size},
               {"eot_token", summary.eot_token},     {"token_bytes", summary.token_bytes},
               {"documents", summary.documents},     {"train_tokens", summary.train_tokens},
               {"val_tokens", summary.val_tokens}};
  if (chat) {  // docs/data.md, "Chat and instruction data"
    info["format"] = o.format;
    info["template"] = summary.chat_template;
    info["window"] = summary.window;
    info["records"] = summary.records;
    info["train_masked_tokens"] = summary.train_masked;
    info["val_masked_tokens"] = summary.val_masked;
  }
  write_file_atomic(o.out_dir / kDatasetInfoFile, info.dump(2) + "\n");
  written.add(o.out_dir / kDatasetInfoFile);
  written.commit();

  // Shards of an earlier run that this one did not rewrite would otherwise join the dataset.
  for (const auto& f : stale) {
    bool rewritten = false;
    for (const auto& w : summary.train_files) rewritten |= w.filename() == f.filename();
    for (const auto& w : summary.val_files) rewritten |= w.filename() == f.filename();
    if (!rewritten) fs::remove(f, ec);
  }
  // A mask shard this run did not write would turn its (new or old) token shard into chat data.
  for (const auto& f : stale) {
    const fs::path m = loss_mask_path(f);
    bool rewritten = false;
    for (const auto& w : summary.train_files) rewritten |= chat && w.filename() == f.filename();
    for (const auto& w : summary.val_files) rewritten |= chat && w.filename() == f.filename();
    if (!rewritten) fs::remove(m, ec);
  }
  return summary;
}

}  // namespace memfit::io
