// The chat and instruct half of `memfit prepare` (prepare.h): JSONL records to one padded
// window each, tokens and loss mask side by side, split into train and val by records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/io/data/prepare.h"
#include "memfit/io/tokenizer/tokenizer.h"

namespace memfit::io {

struct ChatTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // one byte per token: 1 where the token is a trained target
  int64_t val_begin = 0;      // the first token of the val split (train ends with a pad there)
  std::string template_name;
  int64_t records = 0, truncated = 0, dropped = 0;
  int64_t train_masked = 0, val_masked = 0;
};

// Reads options.inputs as JSONL (options.format "chat" or "instruct"), renders each record
// (options.chat_template), cuts or pads it to options.window tokens, and lays out train records,
// a pad, val records, a pad. Throws ConfigError for a bad window, template or fraction, IoError
// for malformed records (file, line, field) or when no record is left.
ChatTokens tokenize_chat_records(const PrepareOptions& options, const Tokenizer& tokenizer,
                                 const PrepareProgress& progress);

}  // namespace memfit::io
