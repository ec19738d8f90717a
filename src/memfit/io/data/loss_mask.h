// Loss-mask shards: which tokens of a token shard are trained as targets, for chat and
// instruction data (`memfit prepare --format chat|instruct`). A mask shard lies beside its
// token shard with the same name and the extension .mask (train_000000.bin ->
// train_000000.mask, so find_token_shards never takes it for a token shard): a header of 256
// int32 (magic, version, token count, bytes per token, zeros), then one byte per token, 0 or 1.
// Byte i belongs to token i of the token shard: 1 means the position that predicts token i
// counts in the loss and its gradients. The format is in docs/data.md, "Loss masks".
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace memfit::io {

inline constexpr int32_t kMaskMagic = 20251129;
inline constexpr int32_t kMaskVersion = 1;

// The mask shard beside a token shard: the same path with the extension .mask.
std::filesystem::path loss_mask_path(const std::filesystem::path& token_shard);

// Writes `mask` (one 0 or 1 per token) to `path` atomically (atomic_file.h). Throws IoError for
// a byte other than 0 or 1, naming its position, before anything is written.
void write_loss_mask(const std::filesystem::path& path, std::span<const uint8_t> mask);

// Checks the header of `path` (magic, version, one byte per token, file size = 1024 + count)
// and returns the token count. Throws IoError naming the file and the field at fault.
int64_t read_loss_mask_header(const std::filesystem::path& path);

// The whole mask of `path` (tests, small shards), every byte checked to be 0 or 1.
std::vector<uint8_t> read_loss_mask(const std::filesystem::path& path);

// Whether the token shards have mask shards: true when every one has its .mask, false when none
// has. Throws IoError naming the first token shard without one when only some have them.
bool have_loss_masks(const std::vector<std::filesystem::path>& token_shards);

}  // namespace memfit::io
