// Chat templates: records to tokens and loss masks; see chat_template.h and docs/data.md.
#include "memfit/io/data/chat_template.h"

#include "memfit/core/error.h"
#include "memfit/io/tokenizer/hf_tokenizer.h"

namespace memfit::io {

ChatTemplateKind parse_chat_template(std::string_view name) {
  if (name == "llama3") return ChatTemplateKind::llama3;
  if (name == "chatml") return ChatTemplateKind::chatml;
  if (name == "plain") return ChatTemplateKind::plain;
  MEMFIT_THROW(ConfigError, "prepare", "unknown template '{}'; expected llama3, chatml or plain",
               name);
}

const char* chat_template_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::llama3: return "llama3";
    case ChatTemplateKind::chatml: return "chatml";
    case ChatTemplateKind::plain: return "plain";
  }
  return "?";
}

namespace {

// The id of a special token spelled `s` in a tokenizer.json, or -1 (other tokenizers: -1).
int32_t special_id(const Tokenizer& t, const char* s) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&t);
  return hf ? hf->token_id(s) : -1;
}

// Jinja's trim, as the Llama 3 template applies it to each message's content.
std::string_view trim(std::string_view s) {
  const char* ws = " \t\n\r\v\f";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

const char* plain_label(ChatRole role) {
  switch (role) {
    case ChatRole::system: return "System: ";
    case ChatRole::user: return "User: ";
    case ChatRole::assistant: return "Assistant: ";
  }
  return "";
}

}  // namespace

ChatTemplate::ChatTemplate(ChatTemplateKind kind, const Tokenizer& tokenizer)
    : kind_(kind), tokenizer_(tokenizer), begin_(tokenizer.eot_token()) {
  end_of_text_ = tokenizer.eot_token();
  for (const char* s : {"<|end_of_text|>", "</s>", "<|endoftext|>"})
    if (const int32_t id = special_id(tokenizer, s); id >= 0) {
      end_of_text_ = id;
      break;
    }
  if (kind == ChatTemplateKind::llama3) {
    auto need = [&](const char* s) {
      const int32_t id = special_id(tokenizer, s);
      if (id < 0)
        MEMFIT_THROW(ConfigError, "prepare", "--template llama3 needs the special token {} in "
                     "the tokenizer, which tokenizer {} does not have; use --tokenizer llama3 "
                     "(or a Llama 3 tokenizer.json)", s, tokenizer.name());
      return id;
    };
    begin_ = need("<|begin_of_text|>");
    header_start_ = need("<|start_header_id|>");
    header_end_ = need("<|end_header_id|>");
    eot_ = need("<|eot_id|>");
  } else if (kind == ChatTemplateKind::chatml) {
    im_start_ = special_id(tokenizer, "<|im_start|>");
    im_end_ = special_id(tokenizer, "<|im_end|>");
  }
}

void ChatTemplate::piece(std::string_view text, uint8_t m, std::vector<int32_t>& tokens,
                         std::vector<uint8_t>& mask, int32_t id) const {
  const size_t before = tokens.size();
  if (id >= 0)
    tokens.push_back(id);
  else
    tokenizer_.encode_append(text, tokens);
  mask.resize(tokens.size(), 0);
  for (size_t i = before; i < tokens.size(); ++i) mask[i] = m;
}

void ChatTemplate::render(const ChatRecord& record, std::vector<int32_t>& tokens,
                          std::vector<uint8_t>& mask) const {
  piece({}, 0, tokens, mask, begin_);
  switch (kind_) {
    case ChatTemplateKind::llama3:
      for (const ChatMessage& m : record.messages) {
        const uint8_t train = m.role == ChatRole::assistant;
        piece({}, 0, tokens, mask, header_start_);
        piece(chat_role_name(m.role), 0, tokens, mask);
        piece({}, 0, tokens, mask, header_end_);
        piece("\n\n", 0, tokens, mask);
        piece(trim(m.content), train, tokens, mask);
        piece({}, train, tokens, mask, eot_);
      }
      break;
    case ChatTemplateKind::chatml:
      for (const ChatMessage& m : record.messages) {
        const uint8_t train = m.role == ChatRole::assistant;
        piece("<|im_start|>", 0, tokens, mask, im_start_);
        piece(std::string(chat_role_name(m.role)) + "\n", 0, tokens, mask);
        piece(m.content, train, tokens, mask);
        piece("<|im_end|>", train, tokens, mask, im_end_);
        piece("\n", 0, tokens, mask);
      }
      break;
    case ChatTemplateKind::plain:
      for (const ChatMessage& m : record.messages) {
        const bool train = m.role == ChatRole::assistant;
        if (!record.instruct) piece(plain_label(m.role), 0, tokens, mask);
        piece(m.content, train, tokens, mask);
        if (train)
          piece({}, 1, tokens, mask, end_of_text_);
        else if (!record.instruct)
          piece("\n\n", 0, tokens, mask);
      }
      break;
  }
}

}  // namespace memfit::io
