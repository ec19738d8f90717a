// Chat and instruct records to padded windows with loss masks; see prepare_chat.h.
#include "memfit/io/data/prepare_chat.h"

#include <algorithm>
#include <cmath>

#include "memfit/core/error.h"
#include "memfit/io/data/chat_record.h"
#include "memfit/io/data/chat_template.h"

namespace memfit::io {

namespace {

// One record's window: `window` tokens and their mask.
struct Window {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

}  // namespace

ChatTokens tokenize_chat_records(const PrepareOptions& o, const Tokenizer& tokenizer,
                                 const PrepareProgress& progress) {
  const ChatFormat format = parse_chat_format(o.format);
  if (o.window < 2)
    MEMFIT_THROW(ConfigError, "prepare", "--format {} pads every record to one window: pass "
                 "--seq-len T (at least 2), the --seq-len you will train with", o.format);
  for (const auto& input : o.inputs)
    if (input == "brown")
      MEMFIT_THROW(ConfigError, "prepare", "--format {} reads JSONL files of records; brown is "
                   "text (use --format text)", o.format);
  const std::string template_name =
      !o.chat_template.empty() ? o.chat_template
                               : (tokenizer.name() == "llama3" ? "llama3" : "plain");
  const ChatTemplate chat(parse_chat_template(template_name), tokenizer);

  ChatTokens out;
  out.template_name = template_name;
  std::vector<Window> windows;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  const size_t T = static_cast<size_t>(o.window);
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    for (const ChatRecord& record : read_chat_records(o.inputs[f], format)) {
      tokens.clear();
      mask.clear();
      chat.render(record, tokens, mask);
      // The window's targets are its tokens 1 .. T-1 (token T is the next window's first).
      if (tokens.size() > T) {
        ++out.truncated;
        tokens.resize(T);
        mask.resize(T);
      }
      if (std::find(mask.begin() + 1, mask.end(), uint8_t{1}) == mask.end()) {
        ++out.dropped;  // its trained tokens all lay past the window
        continue;
      }
      tokens.resize(T, chat.pad_token());
      mask.resize(T, 0);
      windows.push_back({tokens, mask});
    }
    if (progress)
      progress(static_cast<int64_t>(f + 1), static_cast<int64_t>(o.inputs.size()),
               static_cast<int64_t>(windows.size() * T));
  }
  const int64_t R = static_cast<int64_t>(windows.size());
  out.records = R;
  if (R == 0)
    MEMFIT_THROW(IoError, "prepare", "no record to train in {} file(s) (first: {}){}",
                 o.inputs.size(), o.inputs.front(),
                 out.dropped ? fmt::format("; {} record(s) had no trained token within the "
                                           "{}-token window (raise --seq-len)", out.dropped, T)
                             : "");
  int64_t val = 0;
  if (o.val_fraction > 0) {
    if (R < 2)
      MEMFIT_THROW(ConfigError, "prepare", "{} record(s) are too few to split off a validation "
                   "fraction of {}; use --val-fraction 0 or more records", R, o.val_fraction);
    val = std::clamp<int64_t>(std::llround(o.val_fraction * static_cast<double>(R)), 1, R - 1);
  }
  // Train records, a pad, val records, a pad: each split's last window has its T + 1 tokens.
  auto append = [&](int64_t from, int64_t to, int64_t& masked) {
    for (int64_t r = from; r < to; ++r) {
      const Window& w = windows[static_cast<size_t>(r)];
      out.tokens.insert(out.tokens.end(), w.tokens.begin(), w.tokens.end());
      out.mask.insert(out.mask.end(), w.mask.begin(), w.mask.end());
      masked += std::count(w.mask.begin(), w.mask.end(), uint8_t{1});
    }
    out.tokens.push_back(chat.pad_token());
    out.mask.push_back(0);
  };
  append(0, R - val, out.train_masked);
  out.val_begin = static_cast<int64_t>(out.tokens.size());
  if (val > 0) append(R - val, R, out.val_masked);
  return out;
}

}  // namespace memfit::io
