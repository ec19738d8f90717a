// memfit sample with its KV cache (Note [KV cache], docs/notes/kv-cache.md), on checkpoints of
// the gpt2-tiny and llama-tiny presets trained a step on byte-level data: greedy text with the
// cache is the cache-less text (--no-kv-cache) to the end of the context, from a prompt of
// several tokens, and stops there with a message, the pool's peak past the weights its plan's bytes; --stop ends the text where it first appears
// (not printed); --top-p 1 changes nothing and a tiny one is greedy; --chat replies to each line
// of stdin as the plain template's prompt would be continued; bad options name themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <fmt/format.h>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using test::Output;
using test::slurp;

constexpr const char* kPrompt = "the jury said";  // 13 byte tokens
constexpr int kContext = 64;  // the checkpoints' --seq-len

class Sample : public test::BinaryTest {
 protected:
  Sample() : BinaryTest(11) {}
  // A checkpoint of `preset` after one step on this test's shards, read as bytes.
  fs::path checkpoint(const std::string& preset) const {
    std::ofstream(dir / "data" / "dataset.json")
        << R"({"tokenizer": "byte", "vocab_size": 256, "eot_token": 0, "token_bytes": 2})";
    const fs::path ck = dir / ("ck-" + preset);
    const Output r = memfit(fmt::format(
        "train --model {} --threads 1 --seq-len 64 --batch 2 --eval-every 0 --steps 1 "
        "--data '{}' --save '{}'",
        preset, (dir / "data").string(), ck.string()));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return ck;
  }
  // A LoRA save of `preset` after three steps (a learning rate that moves B off zero).
  // `more`: further train options (a quantized base: --base-dtype nf4 or int8).
  fs::path lora_checkpoint(const std::string& preset, const std::string& more = "") const {
    std::ofstream(dir / "data" / "dataset.json")
        << R"({"tokenizer": "byte", "vocab_size": 256, "eot_token": 0, "token_bytes": 2})";
    std::string tail = more;  // the options as a directory name
    std::replace(tail.begin(), tail.end(), ' ', '_');
    const fs::path ck = dir / ("lora-" + preset + (more.empty() ? "" : "-" + tail));
    const Output r = memfit(fmt::format(
        "train --model {} --threads 1 --seq-len 64 --batch 2 --eval-every 0 --steps 3 "
        "--precision fp32 --lora-rank 4 --lora-alpha 16 --lr 0.05 --data '{}' --save '{}' {}",
        preset, (dir / "data").string(), ck.string(), more));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return ck;
  }
  std::string sample(const fs::path& ck, const std::string& more) const {
    return fmt::format("sample --checkpoint '{}' --prompt '{}' {}", ck.string(), kPrompt, more);
  }
};

TEST_F(Sample, GreedyWithTheCacheIsTheCachelessTextToTheEndOfTheContext) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    const fs::path ck = checkpoint(preset);
    const Output cached = memfit(sample(ck, "--temperature 0 --tokens 100"));
    ASSERT_EQ(cached.exit_code, 0) << cached.err;
    EXPECT_TRUE(cached.says("inference plan: kv cache")) << cached.err;
    // Prompt and generated tokens fill the context; the token after the last is still chosen.
    EXPECT_TRUE(cached.says(fmt::format("{} tokens (kv cache)", kContext - 13 + 1))) << cached.err;
    EXPECT_TRUE(cached.says("the context of 64 tokens is full: stopping")) << cached.err;
    // The plan's bytes are what the pool measured past the weights.
    std::smatch m;
    ASSERT_TRUE(std::regex_search(cached.err, m,
                                  std::regex(R"(\+ (\d+) bytes \(planned (\d+) bytes\))")))
        << cached.err;
    EXPECT_EQ(m[1].str(), m[2].str()) << cached.err;
    EXPECT_GT(std::stoll(m[1].str()), 0);
    const Output plain = memfit(sample(ck, "--temperature 0 --tokens 70 --no-kv-cache"));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_TRUE(plain.says("70 tokens (no kv cache)")) << plain.err;
    EXPECT_FALSE(plain.says("inference plan: kv cache")) << plain.err;
    // The same text as far as the cache goes (each token one byte; decoded as bytes).
    const std::string text = cached.out.substr(0, cached.out.size() - 1);  // without the "\n"
    EXPECT_GT(text.size(), std::string(kPrompt).size());
    EXPECT_EQ(plain.out.rfind(text, 0), 0u) << "cached:\n" << cached.out << "\nplain:\n" << plain.out;
    EXPECT_GT(plain.out.size(), cached.out.size());
    // Short of the context, the two agree to the end.
    const Output cached20 = memfit(sample(ck, "--temperature 0 --tokens 20"));
    const Output plain20 = memfit(sample(ck, "--temperature 0 --tokens 20 --no-kv-cache"));
    EXPECT_EQ(cached20.out, plain20.out);
    EXPECT_EQ(cached.out.rfind(cached20.out.substr(0, cached20.out.size() - 1), 0), 0u);
    EXPECT_FALSE(cached20.says("is full")) << cached20.err;
  }
}

// A LoRA save is sampled as its merged model (merged at load): greedy text equal to that of
// `memfit export --merge-lora`'s directory, whose weights are not the save's base weights.
TEST_F(Sample, ALoraSaveSamplesAsItsMergedExport) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    const fs::path ck = lora_checkpoint(preset), hf = dir / (std::string("merged-") + preset);
    Output r = memfit(fmt::format("export --hf '{}' '{}' --merge-lora", hf.string(), ck.string()));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("adapters merged"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(hf / "adapter_config.json"));
    EXPECT_NE(slurp(hf / "model.safetensors"), slurp(ck / "model.safetensors"));
    const Output lora = memfit(sample(ck, "--temperature 0 --tokens 40 --tokenizer byte"));
    ASSERT_EQ(lora.exit_code, 0) << lora.err;
    EXPECT_TRUE(lora.says("LoRA adapters (rank 4, alpha 16) merged into the weights")) << lora.err;
    const Output merged = memfit(sample(hf, "--temperature 0 --tokens 40 --tokenizer byte"));
    ASSERT_EQ(merged.exit_code, 0) << merged.err;
    EXPECT_GT(lora.out.size(), std::string(kPrompt).size());
    EXPECT_EQ(lora.out, merged.out);
    // bf16 weights merge too (each rounded once).
    const Output half = memfit(sample(ck, "--temperature 0 --tokens 5 --tokenizer byte "
                                          "--precision bf16"));
    EXPECT_EQ(half.exit_code, 0) << half.err;
    EXPECT_TRUE(half.says("merged into the weights")) << half.err;
  }
}

// QLoRA (Note [NF4 weights], "QLoRA") and an int8 base (Note [Int8 weights]): the save's
// model.safetensors is the quantized base dequantized, so sample and export --merge-lora merge
// the adapters into the model they were trained against, and agree; the quantized bytes are
// beside it for --resume.
TEST_F(Sample, AQloraSaveSamplesAsItsMergedExport) {
  for (const char* base : {"nf4", "int8"}) {
    for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
      SCOPED_TRACE(fmt::format("{} {}", base, preset));
      const fs::path ck = lora_checkpoint(preset, fmt::format("--base-dtype {}", base)),
                     hf = dir / fmt::format("qmerged-{}-{}", base, preset);
      EXPECT_TRUE(fs::exists(ck / fmt::format("base_{}.safetensors", base)));
      Output r =
          memfit(fmt::format("export --hf '{}' '{}' --merge-lora", hf.string(), ck.string()));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const Output lora = memfit(sample(ck, "--temperature 0 --tokens 40 --tokenizer byte"));
      ASSERT_EQ(lora.exit_code, 0) << lora.err;
      EXPECT_TRUE(lora.says("merged into the weights")) << lora.err;
      const Output merged = memfit(sample(hf, "--temperature 0 --tokens 40 --tokenizer byte"));
      ASSERT_EQ(merged.exit_code, 0) << merged.err;
      EXPECT_GT(lora.out.size(), std::string(kPrompt).size());
      EXPECT_EQ(lora.out, merged.out);
    }
  }
  // Refused before anything runs, naming the option (exit 2).
  for (const char* bad : {"--base-dtype nf4", "--base-dtype int8"}) {
    const Output x = memfit(fmt::format("train --model gpt2-tiny --steps 1 --data '{}' {}",
                                        (dir / "data").string(), bad));
    EXPECT_EQ(x.exit_code, 2) << bad << ": " << x.err;
    EXPECT_NE(x.err.find("--base-dtype"), std::string::npos) << x.err;
  }
}

TEST_F(Sample, StopEndsTheTextWhereItFirstAppearsAndIsNotPrinted) {
  const fs::path ck = checkpoint("gpt2-tiny");
  const Output all = memfit(sample(ck, "--temperature 0 --tokens 40"));
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const std::string generated = all.out.substr(13, all.out.size() - 14);
  ASSERT_GE(generated.size(), 12u) << all.out;
  // Two bytes from the middle of the text that the shell passes as they are in single quotes.
  std::string stop;
  for (size_t i = 8; i + 2 <= generated.size() && stop.empty(); ++i)
    if (generated.substr(i, 2).find_first_of(std::string("'\\\n\0", 4)) == std::string::npos)
      stop = generated.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << "no two quotable bytes in " << generated;
  const size_t first = generated.find(stop);
  const Output r = memfit(sample(ck, fmt::format("--temperature 0 --tokens 40 --stop '{}'", stop)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(kPrompt) + generated.substr(0, first) + "\n");
  // The same without the cache.
  const Output plain =
      memfit(sample(ck, fmt::format("--temperature 0 --tokens 40 --stop '{}' --no-kv-cache", stop)));
  EXPECT_EQ(plain.out, r.out);
}

TEST_F(Sample, TopPOfOneChangesNothingAndATinyOneIsGreedy) {
  const fs::path ck = checkpoint("llama-tiny");
  const Output seeded = memfit(sample(ck, "--temperature 1 --top-k 0 --seed 5 --tokens 30"));
  const Output one = memfit(sample(ck, "--temperature 1 --top-k 0 --seed 5 --tokens 30 --top-p 1"));
  ASSERT_EQ(seeded.exit_code, 0) << seeded.err;
  EXPECT_EQ(seeded.out, one.out);
  const Output greedy = memfit(sample(ck, "--temperature 0 --tokens 30"));
  const Output nucleus = memfit(sample(ck, "--temperature 1 --top-k 0 --top-p 1e-6 --tokens 30"));
  ASSERT_EQ(nucleus.exit_code, 0) << nucleus.err;
  EXPECT_EQ(nucleus.out, greedy.out);
  // The seed's text is not the greedy one (so the two checks above can fail).
  EXPECT_NE(seeded.out, greedy.out);
}

TEST_F(Sample, ChatRepliesToEachLineAsThePlainTemplatesPromptIsContinued) {
  const fs::path ck = checkpoint("gpt2-tiny");
  // The first turn's reply is the continuation of "User: ab\nAssistant:", cut at "\nUser:".
  const Output want = memfit(fmt::format(
      "sample --checkpoint '{}' --temperature 0 --tokens 10 --prompt \"$(printf 'User: "
      "ab\\nAssistant:')\" --stop \"$(printf '\\nUser:')\"",
      ck.string()));
  ASSERT_EQ(want.exit_code, 0) << want.err;
  const std::string reply = want.out.substr(std::string("User: ab\nAssistant:").size());
  const Output r = memfit(
      fmt::format("sample --checkpoint '{}' --temperature 0 --tokens 10 --chat", ck.string()),
      "printf 'ab\\ncd\\n' |");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(reply, 0), 0u) << "chat:\n" << r.out << "\nwant:\n" << reply;
  EXPECT_GT(r.out.size(), reply.size());  // a second reply followed
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '>'), 3) << r.err;  // two prompts and EOF
}

TEST_F(Sample, BadOptionsAreErrorsNamingTheOption) {
  const fs::path ck = checkpoint("gpt2-tiny");
  for (const auto& [option, says] : std::vector<std::pair<std::string, std::string>>{
           {"--top-p 0", "--top-p must be in (0, 1]"},
           {"--top-p 1.5", "--top-p must be in (0, 1]"},
           {"--top-p -0.2", "--top-p must be in (0, 1]"},
           {"--top-p nan", "--top-p must be in (0, 1]"},
           {"--stop ''", "--stop must not be empty"},
           {"--chat --prompt hi", "--chat reads its prompts from stdin"},
           {"--top-k -1", "--top-k must be >= 0"},
           {"--tokens -3", "--tokens must be >= 0"}}) {
    const Output r = memfit(fmt::format("sample --checkpoint '{}' {}", ck.string(), option));
    EXPECT_EQ(r.exit_code, 2) << option << "\n" << r.err;
    EXPECT_TRUE(r.says(says)) << option << "\n" << r.err;
  }
}

}  // namespace
}  // namespace memfit
