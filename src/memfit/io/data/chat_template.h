// Chat templates: a chat or instruction record (chat_record.h) to token ids and a loss mask,
// for `memfit prepare --template llama3|chatml|plain`. Only what the model should learn to
// write is masked in: each assistant message's content and the end-of-turn token that closes
// it; system and user messages, the role headers and the document token are context.
//   llama3: Meta's Llama 3 instruct format, the chat_template of its tokenizer_config.json:
//     <|begin_of_text|> then per message <|start_header_id|>ROLE<|end_header_id|>"\n\n"
//     CONTENT(trimmed)<|eot_id|>; the special tokens' ids from the tokenizer.json (--tokenizer
//     llama3 or a tokenizer.json that has them). The same ids as transformers' (and
//     transformers.js's) apply_chat_template, without the generation prompt it appends.
//   chatml: <|im_start|>ROLE"\n"CONTENT<|im_end|>"\n" per message (Qwen, OpenAI's ChatML),
//     after the tokenizer's document token; <|im_start|> and <|im_end|> are single tokens when
//     the tokenizer.json has them, else their text. Trained: the content and <|im_end|>.
//   plain: no special tokens but the tokenizer's: the document token, then per message
//     "System: " / "User: " / "Assistant: " and the content, "\n\n" after system and user
//     messages, the tokenizer's end-of-text token after each assistant message (trained). An
//     instruct record is the prompt and the completion joined as they are, then end-of-text
//     (OpenAI's prompt/completion fine-tuning).
// Each piece (header, content, end) is tokenized on its own, so the mask boundary falls between
// tokens; for llama3 the pieces are the sections between its special tokens, which is what
// tokenizing the rendered text gives.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "memfit/io/data/chat_record.h"
#include "memfit/io/tokenizer/tokenizer.h"

namespace memfit::io {

enum class ChatTemplateKind { llama3, chatml, plain };
// "llama3", "chatml" or "plain"; ConfigError otherwise.
ChatTemplateKind parse_chat_template(std::string_view name);
const char* chat_template_name(ChatTemplateKind kind);

class ChatTemplate {
 public:
  // Looks up the template's special tokens in `tokenizer` (kept by reference). Throws
  // ConfigError when llama3's are missing (naming the token and --tokenizer llama3).
  ChatTemplate(ChatTemplateKind kind, const Tokenizer& tokenizer);

  // Appends the record's tokens to `tokens` and one mask byte per token to `mask`: 1 for a
  // token that is trained as a target (the position before it predicts it), else 0.
  void render(const ChatRecord& record, std::vector<int32_t>& tokens,
              std::vector<uint8_t>& mask) const;

  // The token padding fills a window with (masked out): the end-of-text token.
  int32_t pad_token() const { return end_of_text_; }
  ChatTemplateKind kind() const { return kind_; }

 private:
  // Appends the ids of `text`, or of `id` when it is >= 0, with mask `m`.
  void piece(std::string_view text, uint8_t m, std::vector<int32_t>& tokens,
             std::vector<uint8_t>& mask, int32_t id = -1) const;

  ChatTemplateKind kind_;
  const Tokenizer& tokenizer_;
  int32_t begin_ = -1;          // the document token (llama3: <|begin_of_text|>)
  int32_t end_of_text_ = -1;    // plain's end of an assistant turn; the padding
  int32_t header_start_ = -1, header_end_ = -1, eot_ = -1;  // llama3
  int32_t im_start_ = -1, im_end_ = -1;  // chatml, when the vocabulary has them
};

}  // namespace memfit::io
