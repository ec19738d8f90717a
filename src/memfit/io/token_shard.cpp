// llm.c token shards: atomic writer and checking reader; see token_shard.h.
#include "memfit/io/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

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

// Header checks on an open shard; returns the token count.
int64_t check_header(int fd, const fs::path& path) {
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
  if (header[0] != kShardMagic)
    MEMFIT_THROW(IoError, "shard",
                 "{}: bad magic: header[0] is {}, expected {} (not an llm.c/memfit token shard)",
                 path.string(), header[0], kShardMagic);
  if (header[1] != kShardVersion)
    MEMFIT_THROW(IoError, "shard", "{}: unsupported version: header[1] is {}, expected {}",
                 path.string(), header[1], kShardVersion);
  const int64_t count = header[2];
  if (count < 0)
    MEMFIT_THROW(IoError, "shard", "{}: bad token count: header[2] is {}, expected >= 0",
                 path.string(), count);
  const int64_t expected = kShardHeaderBytes + 2 * count;
  if (size != expected)
    MEMFIT_THROW(IoError, "shard",
                 "{}: size mismatch: header[2] (token count) is {}, so the file should be "
                 "{} + 2 * {} = {} bytes, but it is {} bytes ({})",
                 path.string(), count, kShardHeaderBytes, count, expected, size,
                 size < expected ? "truncated" : "trailing bytes");
  return count;
}

}  // namespace

void write_token_shard(const fs::path& path, std::span<const uint16_t> tokens) {
  MEMFIT_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "shard",
               "{}: {} tokens do not fit the header's int32 count", path.string(), tokens.size());
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::string tmp = fmt::format("{}/.{}.tmp.XXXXXX", dir.string(), path.filename().string());
  int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    MEMFIT_THROW(IoError, "shard", "cannot create a temporary file in {}: {}", dir.string(),
                 errno_text());
  File file(fd);
  try {
    std::array<int32_t, kShardHeaderInts> header{};
    header[0] = kShardMagic;
    header[1] = kShardVersion;
    header[2] = static_cast<int32_t>(tokens.size());
    write_all(fd, header.data(), kShardHeaderBytes, tmp);
    write_all(fd, tokens.data(), tokens.size_bytes(), tmp);
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

int64_t read_token_shard_header(const fs::path& path) {
  File file = open_for_reading(path);
  return check_header(file.get(), path);
}

void read_token_shard_into(const fs::path& path, std::span<uint16_t> dst,
                           std::optional<int32_t> vocab_size) {
  File file = open_for_reading(path);
  const int64_t count = check_header(file.get(), path);
  MEMFIT_CHECK(static_cast<int64_t>(dst.size()) == count, "shard",
               "{}: holds {} tokens but the destination has room for {}", path.string(), count,
               dst.size());
  if (!read_all(file.get(), dst.data(), dst.size_bytes(), kShardHeaderBytes, path))
    MEMFIT_THROW(IoError, "shard", "{}: truncated while reading {} tokens", path.string(), count);
  if (vocab_size) {
    for (size_t i = 0; i < dst.size(); ++i) {
      if (dst[i] >= *vocab_size)
        MEMFIT_THROW(IoError, "shard",
                     "{}: token {} at position {} is outside the vocabulary: expected < {} "
                     "(was the shard prepared with another tokenizer?)",
                     path.string(), dst[i], i, *vocab_size);
    }
  }
}

Tensor read_token_shard(const fs::path& path, MemoryPool& pool,
                        std::optional<int32_t> vocab_size) {
  const int64_t count = read_token_shard_header(path);
  Tensor tokens = Tensor::empty(pool, Shape{count}, DType::u16, Category::staging, "shard");
  read_token_shard_into(path, {tokens.data<uint16_t>(), static_cast<size_t>(count)}, vocab_size);
  return tokens;
}

}  // namespace memfit::io
