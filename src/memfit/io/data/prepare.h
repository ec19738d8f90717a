// Dataset preparation behind `memfit prepare`: text files (or the Brown corpus) to train/val
// token shards. In the library, not the CLI, so tests and other tools can call it directly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace memfit::io {

struct PrepareOptions {
  // Text files, each one document; the word "brown" stands for the Brown corpus (500 documents).
  std::vector<std::string> inputs;
  std::filesystem::path out_dir;
  // "gpt2", "llama2", "llama3", "byte" or the path of a tokenizer.json (make_tokenizer).
  std::string tokenizer = "gpt2";
  std::filesystem::path vocab_dir;      // GPT-2 vocabulary folder; empty: find_gpt2_vocab_dir()
  std::filesystem::path brown_dir;      // Brown corpus folder; empty: find_brown_corpus_dir()
  double val_fraction = 0.05;           // in [0, 1): the last fraction of tokens becomes val
  int64_t shard_tokens = 100'000'000;   // at most this many tokens per shard file
  bool overwrite = false;               // replace shards already in out_dir
  // "text": each input a document. "chat" / "instruct": each input a JSONL file of records
  // (chat_record.h), rendered by `chat_template` (chat_template.h; empty: llama3 with the
  // llama3 tokenizer, else plain) and written with loss-mask shards (loss_mask.h).
  std::string format = "text";
  std::string chat_template;
  // Chat and instruct: every record padded (or cut) to this many tokens, one window of
  // `memfit train --seq-len` each (required there; unused for text).
  int64_t window = 0;
};

struct PrepareSummary {
  std::string tokenizer;
  int32_t vocab_size = 0;
  int32_t eot_token = 0;
  int32_t token_bytes = 2;  // the shards' token width: 2 (version 1, uint16) or 4 (version 2)
  int64_t documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  bool val_at_document_boundary = true;
  std::vector<std::filesystem::path> train_files, val_files;
  // Chat and instruct: the template, the window, the records written, those cut to the window
  // (their tail lost) and those dropped because no trained token was left in the window, and
  // the tokens masked in (trained) in each split. Mask shards lie beside train_files/val_files.
  std::string chat_template;
  int64_t window = 0;
  int64_t records = 0, records_truncated = 0, records_dropped = 0;
  int64_t train_masked = 0, val_masked = 0;
};

// Where the validation split starts: a token index into the stream of `num_tokens` tokens whose
// documents start at `doc_starts` (ascending, the first at 0). The nearest document start to
// num_tokens * (1 - fraction) when it gives val between half and twice fraction * num_tokens;
// otherwise the exact token index (val gets at least one token). num_tokens for fraction 0.
// Throws ConfigError when there are too few tokens to split.
struct ValSplit {
  int64_t begin = 0;
  bool at_document_boundary = true;
};
ValSplit choose_val_split(std::span<const int64_t> doc_starts, int64_t num_tokens,
                          double fraction);

// Called after each document: documents done, documents in all, tokens so far.
using PrepareProgress = std::function<void(int64_t, int64_t, int64_t)>;

// What `memfit prepare` records about a dataset in out_dir/dataset.json, so that whoever trains
// on the shards can tell which tokenizer (and vocabulary) made them.
struct DatasetInfo {
  std::string tokenizer;    // the name make_tokenizer took: "gpt2", "llama3", a path ...
  int32_t vocab_size = 0;
  int32_t eot_token = 0;    // the token before each document
  int32_t token_bytes = 2;  // 2: version-1 shards (uint16); 4: version-2 shards (uint32)
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  // Chat and instruct data ("format": "chat"; text: "text", or absent in older files): the
  // template and the window each record was padded to (0 for text).
  std::string format = "text";
  std::string chat_template;
  int64_t window = 0;
};
inline constexpr const char* kDatasetInfoFile = "dataset.json";

// out_dir/dataset.json of a dataset, or nullopt if there is none (shards from llm.c's scripts or
// an older memfit). Throws IoError naming the file when it is malformed.
std::optional<DatasetInfo> read_dataset_info(const std::filesystem::path& dir);

// Tokenizes every document as [eot] + tokens (the tokenizer's document token before each
// document, as in llm.c: GPT-2's <|endoftext|>, Llama 2's <s>, Llama 3's <|begin_of_text|>; so
// documents are separated by it and each shard starts with it), splits off the last
// `val_fraction` of the tokens as validation data (at the nearest document start when that gives
// between half and twice the asked-for share, else at the exact token), and writes
// out_dir/train_000000.bin ... and val_000000.bin ... (see token_shard.h: version 1, uint16, when
// the vocabulary has at most 65,536 tokens, else version 2, uint32) and out_dir/dataset.json.
// Everything is checked before anything is written: inputs that are missing or empty, a bad
// fraction, shards already in out_dir (unless overwrite) throw ConfigError or IoError. If writing
// fails, the files written so far are removed.
// Chat and instruct formats (docs/data.md, "Chat and instruction data"): every record rendered
// by the template, cut to `window` tokens or padded to them with the template's pad token
// (masked out), the last `val_fraction` of the records (at least one when it is not 0) as
// validation data; each split ends with one more pad token, so its last record has a whole
// window (T + 1 tokens). Beside every token shard, its loss-mask shard. Malformed records are
// IoErrors naming file, line and field.
PrepareSummary prepare_dataset(const PrepareOptions& options,
                               const PrepareProgress& progress = {});

}  // namespace memfit::io
