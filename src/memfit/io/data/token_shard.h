// Token shards in llm.c's format, so datasets prepared by llm.c's scripts and by memfit are
// interchangeable: a header of 256 int32 (magic, version, token count, zeros), then the tokens.
// Two headers, as llm.c's dev/data/data_common.py writes them:
//   version 1, uint16 tokens: magic 20240520, version 1 (GPT-2; vocabularies up to 65,536);
//   version 2, uint32 tokens: magic 20240801, version 7 (llm.c's Llama 3 header; any vocabulary).
// memfit calls the second "version 2" in its docs and errors, but writes llm.c's numbers
// (header[1] is 7) so that its shards and llm.c's stay readable by both. Writes are atomic;
// reads check every field and name what is wrong.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"

namespace memfit::io {

inline constexpr int32_t kShardMagic = 20240520;  // version 1: uint16 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;  // version 2: uint32 tokens (llm.c's Llama 3)
inline constexpr int32_t kShardVersionU32 = 7;       // llm.c's number for that header
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// What a shard's header says.
struct ShardInfo {
  int64_t count = 0;        // tokens
  int32_t token_bytes = 2;  // 2 (version 1, uint16) or 4 (version 2, uint32)
};

// The token width that holds every id below `vocab_size`: 2 (uint16) when it is at most 65,536,
// else 4 (uint32).
inline int32_t shard_token_bytes_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

// Writes `tokens` to `path`: to a temporary file in the same folder first, fsynced, then renamed
// over `path` (and the folder fsynced), so a reader sees the old file or the whole new one.
// Throws IoError (with the system's reason) and leaves no temporary file behind.
// The uint16 overload writes a version-1 shard, the uint32 one a version-2 shard.
void write_token_shard(const std::filesystem::path& path, std::span<const uint16_t> tokens);
void write_token_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens);
// Token ids (as tokenizers make them) in a shard of `token_bytes` 2 (version 1) or 4
// (version 2). Throws IoError naming the first id that the width cannot hold (a negative id, or
// one above 65,535 for version 1), and the fix, before anything is written.
void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens,
                       int32_t token_bytes);

// Reads and checks the header of `path`: magic and version (one of the two pairs above), and
// that the file size is exactly 1024 + token_bytes * count bytes. Throws IoError naming the
// file, the field and the expected and actual values.
ShardInfo read_token_shard_info(const std::filesystem::path& path);
// The token count of read_token_shard_info.
int64_t read_token_shard_header(const std::filesystem::path& path);

// Reads the tokens of a version-1 shard into `dst`, which must hold exactly the header's count
// (IoError for a version-2 shard: use the int32 overload). With `vocab_size`, every token must be
// below it (IoError names the first that is not, by position).
void read_token_shard_into(const std::filesystem::path& path, std::span<uint16_t> dst,
                           std::optional<int32_t> vocab_size = std::nullopt);
// Reads the tokens of a shard of either version into `dst` as int32 (uint32 tokens above
// INT32_MAX are an IoError), with the same checks.
void read_token_shard_into(const std::filesystem::path& path, std::span<int32_t> dst,
                           std::optional<int32_t> vocab_size = std::nullopt);

// The tokens of `path` as a 1-d tensor in pool memory (Category::staging, tag "shard"): u16 for
// a version-1 shard, i32 for a version-2 shard.
Tensor read_token_shard(const std::filesystem::path& path, MemoryPool& pool,
                        std::optional<int32_t> vocab_size = std::nullopt);

}  // namespace memfit::io
