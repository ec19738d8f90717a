// llm.c token shards: atomic writer and checking reader; see token_shard.h.
#include "memfit/io/data/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "memfit/core/error.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

std::string errno_text() { return std::strerror(errno); }

// A file descriptor that closes itself.
class File {
 public:
  explicit File(int fd) : fd_(fd) {}
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void write_all(int fd, const void* data, size_t bytes, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MEMFIT_THROW(IoError, "shard", "cannot write {}: {}", path.string(), errno_text());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// Reads exactly `bytes` at `offset`; false if the file ends first.
bool read_all(int fd, void* data, size_t bytes, off_t offset, const fs::path& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MEMFIT_THROW(IoError, "shard", "cannot read {}: {}", path.string(), errno_text());
    if (n == 0) return false;
    p += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

File open_for_reading(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MEMFIT_THROW(IoError, "shard", "cannot open {}: {}", path.string(), errno_text());
  return File(fd);
}

// Header checks on an open shard.
ShardInfo check_header(int fd, const fs::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    MEMFIT_THROW(IoError, "shard", "cannot stat {}: {}", path.string(), errno_text());
  const int64_t size = st.st_size;
  if (size < kShardHeaderBytes)
    MEMFIT_THROW(IoError, "shard",
                 "{}: truncated: file size is {} bytes, less than the {}-byte header",
                 path.string(), size, kShardHeaderBytes);
  std::array<int32_t, kShardHeaderInts> header{};
  if (!read_all(fd, header.data(), kShardHeaderBytes, 0, path))
    MEMFIT_THROW(IoError, "shard", "{}: truncated while reading the header", path.string());
  ShardInfo info;
  if (header[0] == kShardMagic) {
    info.token_bytes = 2;
    if (header[1] != kShardVersion)
      MEMFIT_THROW(IoError, "shard",
                   "{}: unsupported version: header[1] is {}, expected {} for magic {} "
                   "(uint16 tokens)",
                   path.string(), header[1], kShardVersion, kShardMagic);
  } else if (header[0] == kShardMagicU32) {
    info.token_bytes = 4;
    if (header[1] != kShardVersionU32)
      MEMFIT_THROW(IoError, "shard",
                   "{}: unsupported version: header[1] is {}, expected {} for magic {} "
                   "(uint32 tokens, llm.c's Llama 3 header)",
                   path.string(), header[1], kShardVersionU32, kShardMagicU32);
  } else {
    MEMFIT_THROW(IoError, "shard",
                 "{}: bad magic: header[0] is {}, expected {} (uint16 tokens) or {} (uint32 "
                 "tokens) (not an llm.c/memfit token shard)",
                 path.string(), header[0], kShardMagic, kShardMagicU32);
  }
  info.count = header[2];
  if (info.count < 0)
    MEMFIT_THROW(IoError, "shard", "{}: bad token count: header[2] is {}, expected >= 0",
                 path.string(), info.count);
  const int64_t expected = kShardHeaderBytes + info.token_bytes * info.count;
  if (size != expected)
    MEMFIT_THROW(IoError, "shard",
                 "{}: size mismatch: header[2] (token count) is {}, so the file should be "
                 "{} + {} * {} = {} bytes, but it is {} bytes ({})",
                 path.string(), info.count, kShardHeaderBytes, info.token_bytes, info.count,
                 expected, size, size < expected ? "truncated" : "trailing bytes");
  return info;
}

// Writes a shard of `count` tokens of `token_bytes` each from `data`.
void write_shard(const fs::path& path, const void* data, size_t count, int32_t token_bytes) {
  MEMFIT_CHECK(count <= static_cast<size_t>(INT32_MAX), "shard",
               "{}: {} tokens do not fit the header's int32 count", path.string(), count);
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::string tmp = fmt::format("{}/.{}.tmp.XXXXXX", dir.string(), path.filename().string());
  int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    MEMFIT_THROW(IoError, "shard", "cannot create a temporary file in {}: {}", dir.string(),
                 errno_text());
  File file(fd);
  try {
    std::array<int32_t, kShardHeaderInts> header{};
    header[0] = token_bytes == 2 ? kShardMagic : kShardMagicU32;
    header[1] = token_bytes == 2 ? kShardVersion : kShardVersionU32;
    header[2] = static_cast<int32_t>(count);
    write_all(fd, header.data(), kShardHeaderBytes, tmp);
    write_all(fd, data, count * static_cast<size_t>(token_bytes), tmp);
    if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0)
      MEMFIT_THROW(IoError, "shard", "cannot sync {}: {}", tmp, errno_text());
    if (::close(file.release()) != 0)
      MEMFIT_THROW(IoError, "shard", "cannot close {}: {}", tmp, errno_text());
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      MEMFIT_THROW(IoError, "shard", "cannot rename {} to {}: {}", tmp, path.string(),
                   errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the folder's entry is on disk.
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

template <class T>
void check_vocab(const fs::path& path, std::span<const T> tokens,
                 std::optional<int32_t> vocab_size) {
  if (!vocab_size) return;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int64_t>(tokens[i]) >= *vocab_size)
      MEMFIT_THROW(IoError, "shard",
                   "{}: token {} at position {} is outside the vocabulary: expected < {} "
                   "(was the shard prepared with another tokenizer?)",
                   path.string(), static_cast<int64_t>(tokens[i]), i, *vocab_size);
  }
}

}  // namespace

void write_token_shard(const fs::path& path, std::span<const uint16_t> tokens) {
  write_shard(path, tokens.data(), tokens.size(), 2);
}

void write_token_shard(const fs::path& path, std::span<const uint32_t> tokens) {
  write_shard(path, tokens.data(), tokens.size(), 4);
}

void write_token_shard(const fs::path& path, std::span<const int32_t> tokens,
                       int32_t token_bytes) {
  MEMFIT_CHECK(token_bytes == 2 || token_bytes == 4, "shard",
               "{}: token width must be 2 (version 1) or 4 (version 2) bytes, got {}",
               path.string(), token_bytes);
  const int64_t most = token_bytes == 2 ? 65535 : INT32_MAX;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > most)
      MEMFIT_THROW(IoError, "shard",
                   "{}: token {} at position {} does not fit a {} shard (ids 0 to {}){}",
                   path.string(), tokens[i], i,
                   token_bytes == 2 ? "version-1 (uint16)" : "version-2 (uint32)", most,
                   token_bytes == 2 && tokens[i] > most
                       ? "; write a version-2 shard (uint32 tokens): memfit prepare does so "
                         "for vocabularies over 65,536 tokens"
                       : "");
  }
  if (token_bytes == 4) {
    // int32 ids in [0, INT32_MAX] have the same bytes as uint32.
    write_shard(path, tokens.data(), tokens.size(), 4);
    return;
  }
  std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
  write_shard(path, narrow.data(), narrow.size(), 2);
}

ShardInfo read_token_shard_info(const fs::path& path) {
  File file = open_for_reading(path);
  return check_header(file.get(), path);
}

int64_t read_token_shard_header(const fs::path& path) { return read_token_shard_info(path).count; }

void read_token_shard_into(const fs::path& path, std::span<uint16_t> dst,
                           std::optional<int32_t> vocab_size) {
  File file = open_for_reading(path);
  const ShardInfo info = check_header(file.get(), path);
  if (info.token_bytes != 2)
    MEMFIT_THROW(IoError, "shard", "{}: holds uint32 tokens (version 2); read it into int32",
                 path.string());
  MEMFIT_CHECK(static_cast<int64_t>(dst.size()) == info.count, "shard",
               "{}: holds {} tokens but the destination has room for {}", path.string(),
               info.count, dst.size());
  if (!read_all(file.get(), dst.data(), dst.size_bytes(), kShardHeaderBytes, path))
    MEMFIT_THROW(IoError, "shard", "{}: truncated while reading {} tokens", path.string(),
                 info.count);
  check_vocab<uint16_t>(path, dst, vocab_size);
}

void read_token_shard_into(const fs::path& path, std::span<int32_t> dst,
                           std::optional<int32_t> vocab_size) {
  File file = open_for_reading(path);
  const ShardInfo info = check_header(file.get(), path);
  MEMFIT_CHECK(static_cast<int64_t>(dst.size()) == info.count, "shard",
               "{}: holds {} tokens but the destination has room for {}", path.string(),
               info.count, dst.size());
  const size_t bytes = dst.size() * static_cast<size_t>(info.token_bytes);
  if (!read_all(file.get(), dst.data(), bytes, kShardHeaderBytes, path))
    MEMFIT_THROW(IoError, "shard", "{}: truncated while reading {} tokens", path.string(),
                 info.count);
  if (info.token_bytes == 2) {
    // Widen in place from the back: token i's two bytes sit at or before its four.
    const auto* narrow = reinterpret_cast<const uint16_t*>(dst.data());
    for (size_t i = dst.size(); i-- > 0;) dst[i] = narrow[i];
  } else {
    for (size_t i = 0; i < dst.size(); ++i)
      if (dst[i] < 0)
        MEMFIT_THROW(IoError, "shard", "{}: token {} at position {} is above {}, the largest "
                     "id memfit handles", path.string(), static_cast<uint32_t>(dst[i]), i,
                     INT32_MAX);
  }
  check_vocab<int32_t>(path, dst, vocab_size);
}

Tensor read_token_shard(const fs::path& path, MemoryPool& pool,
                        std::optional<int32_t> vocab_size) {
  const ShardInfo info = read_token_shard_info(path);
  const size_t n = static_cast<size_t>(info.count);
  if (info.token_bytes == 2) {
    Tensor tokens = Tensor::empty(pool, Shape{info.count}, DType::u16, Category::staging, "shard");
    read_token_shard_into(path, {tokens.data<uint16_t>(), n}, vocab_size);
    return tokens;
  }
  Tensor tokens = Tensor::empty(pool, Shape{info.count}, DType::i32, Category::staging, "shard");
  read_token_shard_into(path, {tokens.data<int32_t>(), n}, vocab_size);
  return tokens;
}

}  // namespace memfit::io
