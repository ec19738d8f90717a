// JSONL chat and instruction records: valid records parse to messages; malformed ones (bad JSON,
// missing messages, unknown role, non-string content, ...) are IoErrors naming file, line and
// field.
#include "memfit/io/data/chat_record.h"

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "memfit/core/error.h"

namespace memfit::io {
namespace {

using testing::TempDir;
using testing::write_file;

// The message of the IoError parsing `line` as line 7 of data.jsonl throws ("" if none).
std::string error_of(const std::string& line, ChatFormat format = ChatFormat::chat) {
  try {
    parse_chat_record(line, format, "data.jsonl", 7);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& line, const std::string& field,
                  ChatFormat format = ChatFormat::chat) {
  const std::string e = error_of(line, format);
  EXPECT_NE(e.find("data.jsonl:7:"), std::string::npos) << line << " -> " << e;
  EXPECT_NE(e.find(field), std::string::npos) << line << " -> " << e;
}

TEST(ChatRecord, ParsesMessagesAndIgnoresOtherFields) {
  const ChatRecord r = parse_chat_record(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U",
      "name": "x"}, {"role": "assistant", "content": "A"}], "id": 3})",
      ChatFormat::chat, "f", 1);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, ChatRole::system);
  EXPECT_EQ(r.messages[1].content, "U");
  EXPECT_EQ(r.messages[2].role, ChatRole::assistant);
  EXPECT_FALSE(r.instruct);
}

TEST(ChatRecord, InstructIsAUserAndAnAssistantMessage) {
  const ChatRecord r = parse_chat_record(R"({"prompt": "2+2=", "completion": "4"})",
                                         ChatFormat::instruct, "f", 1);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, ChatRole::user);
  EXPECT_EQ(r.messages[0].content, "2+2=");
  EXPECT_EQ(r.messages[1].role, ChatRole::assistant);
  EXPECT_TRUE(r.instruct);
}

TEST(ChatRecord, MalformedRecordsNameFileLineAndField) {
  expect_error(R"({"messages": [)", "not a JSON object");
  expect_error(R"([1, 2])", "expected a JSON object");
  expect_error(R"({"msgs": []})", "field messages: missing");
  expect_error(R"({"messages": {}})", "field messages: expected an array");
  expect_error(R"({"messages": []})", "field messages: empty");
  expect_error(R"({"messages": [3]})", "field messages[0]: expected an object");
  expect_error(R"({"messages": [{"content": "x"}]})", "field messages[0].role: missing");
  expect_error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]})",
               "field messages[1].role: unknown role \"bot\"");
  expect_error(R"({"messages": [{"role": "assistant", "content": ["a", "b"]}]})",
               "field messages[0].content: expected a string, got array");
  expect_error(R"({"messages": [{"role": "assistant"}]})", "field messages[0].content: missing");
  expect_error(R"({"messages": [{"role": "user", "content": "only a question"}]})",
               "no assistant message");
  expect_error(R"({"prompt": "p"})", "field completion: missing", ChatFormat::instruct);
  expect_error(R"({"prompt": 1, "completion": "c"})", "field prompt: expected a string",
               ChatFormat::instruct);
  expect_error(R"({"prompt": "p", "completion": ""})", "field completion: empty",
               ChatFormat::instruct);
}

TEST(ChatRecord, FileLinesCountFromOneAndSkipBlankLines) {
  TempDir dir;
  const auto file = dir / "d.jsonl";
  write_file(file, "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n  \n"
                   "{\"prompt\": \"c\", \"completion\": 5}\n");
  try {
    read_chat_records(file, ChatFormat::instruct);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string() + ":4: field completion"),
              std::string::npos) << e.what();
  }
  write_file(file, "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"prompt\": \"c\", "
                   "\"completion\": \"d\"}");
  EXPECT_EQ(read_chat_records(file, ChatFormat::instruct).size(), 2u);
  EXPECT_THROW(read_chat_records(dir / "missing.jsonl", ChatFormat::chat), IoError);
  EXPECT_THROW(parse_chat_format("jsonl"), ConfigError);
}

}  // namespace
}  // namespace memfit::io
