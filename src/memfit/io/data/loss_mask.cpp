// Loss-mask shards: writer and checking reader; see loss_mask.h and docs/data.md.
#include "memfit/io/data/loss_mask.h"

#include <array>
#include <fstream>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/data/token_shard.h"

namespace memfit::io {

namespace fs = std::filesystem;

fs::path loss_mask_path(const fs::path& token_shard) {
  fs::path p = token_shard;
  p.replace_extension(".mask");
  return p;
}

void write_loss_mask(const fs::path& path, std::span<const uint8_t> mask) {
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] > 1)
      MEMFIT_THROW(IoError, "mask", "{}: byte {} at position {} is not 0 or 1", path.string(),
                   int(mask[i]), i);
  MEMFIT_CHECK(mask.size() <= static_cast<size_t>(INT32_MAX), "mask",
               "{}: {} tokens do not fit the header's int32 count", path.string(), mask.size());
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kMaskMagic;
  header[1] = kMaskVersion;
  header[2] = static_cast<int32_t>(mask.size());
  header[3] = 1;  // bytes per token
  write_file_atomic(path, [&](FileWriter& w) {
    w.write(header.data(), kShardHeaderBytes);
    w.write(mask.data(), mask.size());
  });
}

namespace {

int64_t check_header(std::ifstream& in, const fs::path& path) {
  if (!in) MEMFIT_THROW(IoError, "mask", "cannot open {}", path.string());
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) MEMFIT_THROW(IoError, "mask", "cannot stat {}: {}", path.string(), ec.message());
  if (size < kShardHeaderBytes)
    MEMFIT_THROW(IoError, "mask", "{}: truncated: {} bytes, less than the {}-byte header",
                 path.string(), size, kShardHeaderBytes);
  std::array<int32_t, kShardHeaderInts> header{};
  in.read(reinterpret_cast<char*>(header.data()), kShardHeaderBytes);
  if (!in) MEMFIT_THROW(IoError, "mask", "{}: truncated while reading the header", path.string());
  if (header[0] != kMaskMagic)
    MEMFIT_THROW(IoError, "mask", "{}: bad magic: header[0] is {}, expected {} (not a memfit "
                 "loss-mask shard)", path.string(), header[0], kMaskMagic);
  if (header[1] != kMaskVersion)
    MEMFIT_THROW(IoError, "mask", "{}: unsupported version: header[1] is {}, expected {}",
                 path.string(), header[1], kMaskVersion);
  if (header[3] != 1)
    MEMFIT_THROW(IoError, "mask", "{}: header[3] (bytes per token) is {}, expected 1",
                 path.string(), header[3]);
  const int64_t count = header[2];
  if (count < 0 || size != kShardHeaderBytes + count)
    MEMFIT_THROW(IoError, "mask", "{}: size mismatch: header[2] (token count) is {}, so the "
                 "file should be {} bytes, but it is {}", path.string(), count,
                 kShardHeaderBytes + count, size);
  return count;
}

}  // namespace

int64_t read_loss_mask_header(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return check_header(in, path);
}

std::vector<uint8_t> read_loss_mask(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const int64_t count = check_header(in, path);
  std::vector<uint8_t> mask(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(mask.data()), count);
  if (!in) MEMFIT_THROW(IoError, "mask", "{}: truncated while reading {} bytes", path.string(),
                        count);
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] > 1)
      MEMFIT_THROW(IoError, "mask", "{}: byte {} at position {} is not 0 or 1", path.string(),
                   int(mask[i]), i);
  return mask;
}

bool have_loss_masks(const std::vector<fs::path>& token_shards) {
  size_t with = 0;
  std::error_code ec;
  for (const auto& s : token_shards) with += fs::exists(loss_mask_path(s), ec) ? 1 : 0;
  if (with == 0) return false;
  if (with == token_shards.size()) return true;
  for (const auto& s : token_shards)
    if (!fs::exists(loss_mask_path(s), ec))
      MEMFIT_THROW(IoError, "mask", "{} has no loss mask ({}) but other shards of its split do; "
                   "prepare the data again", s.string(), loss_mask_path(s).filename().string());
  return true;
}

}  // namespace memfit::io
