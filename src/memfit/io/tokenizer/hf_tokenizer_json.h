// The reader of Hugging Face tokenizer.json files: what a BPE tokenizer file says, checked and
// laid out as plain data (vocabulary, merges, normalizer, pre-tokenizer, decoder, added tokens),
// so hf_tokenizer.cpp only has to run it. What memfit does not run (other model types,
// normalizers, pre-tokenizers or decoders) is refused here, naming the file and the field, rather
// than tokenized differently from the tokenizer the file was made for. See docs/data.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace memfit::io {

// A token the file adds on top of the model's vocabulary ("added_tokens"): matched in the text
// before anything else (hf_tokenizer.h says how).
struct HfAddedToken {
  int32_t id = 0;
  std::string content;
  bool lstrip = false, rstrip = false, special = false;
};

struct HfNormalizerStep {
  enum class Kind { prepend, replace, nfc, nfd, nfkc, nfkd };
  Kind kind = Kind::prepend;
  std::string text;         // prepend: the prefix; replace: the string replaced
  std::string replacement;  // replace: what replaces it
};

struct HfPreTokenizerStep {
  enum class Kind { split, byte_level };
  Kind kind = Kind::split;
  // split: an ICU regular expression with JavaScript's meaning (js_regex_to_icu), or a literal
  // string; `invert` keeps only the matches; `removed` drops them (else they are kept as pieces
  // of their own: "Isolated").
  std::string pattern;
  bool literal = false, invert = false, removed = false;
  // byte_level: a space before a piece that does not start with one; GPT-2's split.
  bool add_prefix_space = false, use_regex = true;
};

struct HfDecoderStep {
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip };
  Kind kind = Kind::byte_level;
  std::string text, replacement;  // replace: literal strings; strip: `text` is the content
  int32_t start = 0, stop = 0;    // strip: how many leading and trailing `text` to remove
};

struct HfTokenizerJson {
  std::filesystem::path file;
  // model (type BPE)
  std::vector<std::pair<std::string, int32_t>> vocab;  // as spelled in the file
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::optional<std::string> unk_token;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::vector<HfNormalizerStep> normalizer;        // applied in order; empty: none
  std::vector<HfPreTokenizerStep> pre_tokenizer;   // applied in order; empty: none
  std::vector<HfDecoderStep> decoder;              // applied in order; empty: none
  std::vector<HfAddedToken> added_tokens;
  // post_processor TemplateProcessing: the first special token of the "single" template (the
  // token Hugging Face puts before a sequence, e.g. "<s>"); empty if there is none.
  std::string template_first_special;

  // True when the pre-tokenizer maps bytes to GPT-2's printable characters (a ByteLevel step).
  bool byte_level() const;
};

// Reads and checks `file`. Throws IoError when it is missing or is not the JSON of a tokenizer
// (naming the file and the field), ConfigError for what it says that memfit does not support
// (naming the file, the field and the supported values).
HfTokenizerJson read_hf_tokenizer_json(const std::filesystem::path& file);

}  // namespace memfit::io
