// JSONL chat and instruction records: parsing with errors that name file, line and field.
#include "memfit/io/data/chat_record.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"

namespace memfit::io {

using nlohmann::json;

ChatFormat parse_chat_format(std::string_view name) {
  if (name == "chat") return ChatFormat::chat;
  if (name == "instruct") return ChatFormat::instruct;
  MEMFIT_THROW(ConfigError, "prepare", "unknown format '{}'; expected text, chat or instruct",
               name);
}

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::system: return "system";
    case ChatRole::user: return "user";
    case ChatRole::assistant: return "assistant";
  }
  return "?";
}

namespace {

const char* json_type(const json& j) { return j.type_name(); }

// The string at `j[key]` of the object `j`, or an error naming `field`.
std::string string_field(const json& j, const char* key, const std::string& field,
                         std::string_view file, int64_t line_no) {
  const auto it = j.find(key);
  if (it == j.end())
    MEMFIT_THROW(IoError, "prepare", "{}:{}: field {}: missing", file, line_no, field);
  if (!it->is_string())
    MEMFIT_THROW(IoError, "prepare", "{}:{}: field {}: expected a string, got {}", file, line_no,
                 field, json_type(*it));
  return it->get<std::string>();
}

}  // namespace

ChatRecord parse_chat_record(std::string_view line, ChatFormat format, std::string_view file,
                             int64_t line_no) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "prepare", "{}:{}: not a JSON object: {}", file, line_no, e.what());
  }
  if (!j.is_object())
    MEMFIT_THROW(IoError, "prepare", "{}:{}: expected a JSON object per line, got {}", file,
                 line_no, json_type(j));
  ChatRecord record;
  if (format == ChatFormat::instruct) {
    record.instruct = true;
    std::string prompt = string_field(j, "prompt", "prompt", file, line_no);
    std::string completion = string_field(j, "completion", "completion", file, line_no);
    if (completion.empty())
      MEMFIT_THROW(IoError, "prepare", "{}:{}: field completion: empty (nothing to train)", file,
                   line_no);
    record.messages.push_back({ChatRole::user, std::move(prompt)});
    record.messages.push_back({ChatRole::assistant, std::move(completion)});
    return record;
  }
  const auto it = j.find("messages");
  if (it == j.end())
    MEMFIT_THROW(IoError, "prepare", "{}:{}: field messages: missing (a chat record is "
                 "{{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}})", file, line_no);
  if (!it->is_array())
    MEMFIT_THROW(IoError, "prepare", "{}:{}: field messages: expected an array, got {}", file,
                 line_no, json_type(*it));
  if (it->empty())
    MEMFIT_THROW(IoError, "prepare", "{}:{}: field messages: empty", file, line_no);
  bool trained = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object())
      MEMFIT_THROW(IoError, "prepare", "{}:{}: field {}: expected an object, got {}", file,
                   line_no, at, json_type(m));
    const std::string role = string_field(m, "role", at + ".role", file, line_no);
    ChatMessage message;
    if (role == "system")
      message.role = ChatRole::system;
    else if (role == "user")
      message.role = ChatRole::user;
    else if (role == "assistant")
      message.role = ChatRole::assistant;
    else
      MEMFIT_THROW(IoError, "prepare", "{}:{}: field {}.role: unknown role \"{}\" (expected "
                   "system, user or assistant)", file, line_no, at, role);
    message.content = string_field(m, "content", at + ".content", file, line_no);
    trained |= message.role == ChatRole::assistant;
    record.messages.push_back(std::move(message));
  }
  if (!trained)
    MEMFIT_THROW(IoError, "prepare", "{}:{}: field messages: no assistant message (nothing to "
                 "train)", file, line_no);
  return record;
}

std::vector<ChatRecord> read_chat_records(const std::filesystem::path& file, ChatFormat format) {
  std::ifstream in(file, std::ios::binary);
  if (!in) MEMFIT_THROW(IoError, "prepare", "cannot open input {}", file.string());
  std::vector<ChatRecord> records;
  std::string line;
  const std::string name = file.string();
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r\n\v\f") == std::string::npos) continue;
    records.push_back(parse_chat_record(line, format, name, line_no));
  }
  if (in.bad()) MEMFIT_THROW(IoError, "prepare", "cannot read input {}", name);
  return records;
}

}  // namespace memfit::io
