// Dataset preparation behind `memfit prepare`: text files (or the Brown corpus) to train/val
// token shards. In the library, not the CLI, so tests and other tools can call it directly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace memfit::io {

struct PrepareOptions {
  // Text files, each one document; the word "brown" stands for the Brown corpus (500 documents).
  std::vector<std::string> inputs;
  std::filesystem::path out_dir;
  std::string tokenizer = "gpt2";       // "gpt2" or "byte"
  std::filesystem::path vocab_dir;      // GPT-2 vocabulary folder; empty: find_gpt2_vocab_dir()
  std::filesystem::path brown_dir;      // Brown corpus folder; empty: find_brown_corpus_dir()
  double val_fraction = 0.05;           // in [0, 1): the last fraction of tokens becomes val
  int64_t shard_tokens = 100'000'000;   // at most this many tokens per shard file
  bool overwrite = false;               // replace shards already in out_dir
};

struct PrepareSummary {
  std::string tokenizer;
  int32_t vocab_size = 0;
  int64_t documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  bool val_at_document_boundary = true;
  std::vector<std::filesystem::path> train_files, val_files;
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

// Tokenizes every document as [eot] + tokens (the end-of-text token before each document, as in
// llm.c, so documents are separated by it and each shard starts with it), splits off the last
// `val_fraction` of the tokens as validation data (at the nearest document start when that gives
// between half and twice the asked-for share, else at the exact token), and writes
// out_dir/train_000000.bin ... and val_000000.bin ... (see token_shard.h).
// Everything is checked before anything is written: inputs that are missing or empty, a bad
// fraction, shards already in out_dir (unless overwrite) throw ConfigError or IoError. If writing
// fails, the files written so far are removed.
PrepareSummary prepare_dataset(const PrepareOptions& options,
                               const PrepareProgress& progress = {});

}  // namespace memfit::io
