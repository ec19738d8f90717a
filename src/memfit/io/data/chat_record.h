// Chat and instruction records, one JSON object a line (JSONL), as `memfit prepare --format
// chat|instruct` reads them: OpenAI's chat fine-tuning records {"messages": [{"role": ...,
// "content": ...}, ...]} and prompt/completion records {"prompt": ..., "completion": ...}.
// A malformed record is an IoError naming the file, the line and the field at fault.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace memfit::io {

enum class ChatFormat { chat, instruct };
// "chat" or "instruct"; ConfigError otherwise.
ChatFormat parse_chat_format(std::string_view name);

enum class ChatRole { system, user, assistant };
const char* chat_role_name(ChatRole role);

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
};

// A record as messages: an instruct record is a user message (the prompt) and an assistant
// message (the completion), marked `instruct` so the plain template can join them as they are.
struct ChatRecord {
  std::vector<ChatMessage> messages;
  bool instruct = false;
};

// One line of `file` (line numbers count from 1), for the error messages. Chat: "messages" is a
// non-empty array of objects whose "role" is "system", "user" or "assistant" and whose
// "content" is a string, with at least one assistant message (else nothing is trained).
// Instruct: "prompt" and "completion" are strings, the completion not empty. Other fields are
// ignored. Throws IoError "FILE:LINE: field F: what is wrong" (F is "messages[2].role", say;
// bad JSON names no field but the parser's position).
ChatRecord parse_chat_record(std::string_view line, ChatFormat format, std::string_view file,
                             int64_t line_no);

// Every record of a JSONL file, skipping lines that are empty or all white space. Throws
// IoError when the file cannot be read or a record is malformed (parse_chat_record).
std::vector<ChatRecord> read_chat_records(const std::filesystem::path& file, ChatFormat format);

}  // namespace memfit::io
