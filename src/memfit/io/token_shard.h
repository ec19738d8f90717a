// Token shards in llm.c's format, so datasets prepared by llm.c's scripts and by memfit are
// interchangeable: a header of 256 int32 (magic 20240520, version 1, token count, zeros), then
// the tokens as uint16. Writes are atomic; reads check every field and name what is wrong.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>

#include "memfit/core/tensor.h"
#include "memfit/memory/pool.h"

namespace memfit::io {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` to `path`: to a temporary file in the same folder first, fsynced, then renamed
// over `path` (and the folder fsynced), so a reader sees the old file or the whole new one.
// Throws IoError (with the system's reason) and leaves no temporary file behind.
void write_token_shard(const std::filesystem::path& path, std::span<const uint16_t> tokens);

// Reads and checks the header of `path`: magic, version, and that the file size is exactly
// 1024 + 2 * count bytes. Returns the token count. Throws IoError naming the file, the field and
// the expected and actual values.
int64_t read_token_shard_header(const std::filesystem::path& path);

// Reads the tokens of `path` into `dst`, which must hold exactly the header's count. With
// `vocab_size`, every token must be below it (IoError names the first that is not, by position).
void read_token_shard_into(const std::filesystem::path& path, std::span<uint16_t> dst,
                           std::optional<int32_t> vocab_size = std::nullopt);

// The tokens of `path` as a 1-d u16 tensor in pool memory (Category::staging, tag "shard").
Tensor read_token_shard(const std::filesystem::path& path, MemoryPool& pool,
                        std::optional<int32_t> vocab_size = std::nullopt);

}  // namespace memfit::io
