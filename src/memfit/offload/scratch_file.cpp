// Offload scratch files (scratch_file.h).
#include "memfit/offload/scratch_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/created_directories.h"
#include "memfit/offload/offload_layout.h"

namespace memfit::offload {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& path, const char* what, int err) {
  MEMFIT_THROW(IoError, "offload", "{}: {}: {} (errno {})", path.string(), what,
               std::strerror(err), err);
}

}  // namespace

nlohmann::json cut_points(const std::vector<int64_t>& starts) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 over each start's 8 little-endian bytes
  for (int64_t x : starts)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(x) >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  return {{"count", starts.size()}, {"fnv1a", fmt::format("{:016x}", h)}};
}

ScratchFile::ScratchFile(fs::path path, uint64_t bytes, nlohmann::json header)
    : path_(std::move(path)), bytes_(bytes), header_(std::move(header)) {
  const int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0600);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) {
    // The filesystem does not do direct I/O (tmpfs): buffered I/O works the same, through the
    // page cache.
    fd_ = ::open(path_.c_str(), flags, 0600);
    static std::once_flag said;
    if (fd_ >= 0)
      std::call_once(said, [&] {
        fmt::print(stderr, "memfit: {} does not allow O_DIRECT; offload I/O goes through the "
                           "page cache\n",
                   path_.parent_path().string());
      });
  }
  if (fd_ < 0) fail(path_, "cannot create the offload file", errno);
  if (const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes_)); rc != 0) {
    ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    fs::remove(path_, ec);
    fail(path_, fmt::format("cannot reserve {} bytes", bytes_).c_str(), rc);
  }
  header_["bytes"] = bytes_;
  write_header();
}

ScratchFile::~ScratchFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ec;
  fs::remove(path_, ec);
}

void ScratchFile::set_step(int64_t step) {
  header_["step"] = step;
  write_header();
}

void ScratchFile::write_header() {
  std::string text = header_.dump();
  text.push_back('\n');
  MEMFIT_CHECK(text.size() <= kHeaderBytes, "offload", "{}: header of {} bytes exceeds {}",
               path_.string(), text.size(), kHeaderBytes);
  // One aligned page (O_DIRECT), padded with spaces.
  void* page = std::aligned_alloc(kIoAlign, kHeaderBytes);
  std::memset(page, ' ', kHeaderBytes);
  std::memcpy(page, text.data(), text.size());
  const ssize_t n = ::pwrite(fd_, page, kHeaderBytes, 0);
  const int err = errno;
  std::free(page);
  if (n != static_cast<ssize_t>(kHeaderBytes))
    fail(path_, "cannot write the header", n < 0 ? err : EIO);
}

nlohmann::json ScratchFile::read_header(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  std::string page(kHeaderBytes, '\0');
  const ssize_t n = ::pread(fd, page.data(), page.size(), 0);
  ::close(fd);
  if (n <= 0) fail(path, "cannot read the header", n < 0 ? errno : EIO);
  page.resize(page.find('\n') == std::string::npos ? static_cast<size_t>(n) : page.find('\n'));
  return nlohmann::json::parse(page);
}

uint64_t free_disk_bytes(const fs::path& dir) {
  struct statvfs s;
  if (::statvfs(io::existing_ancestor(dir).c_str(), &s) != 0)
    fail(dir, "cannot stat the filesystem", errno);
  return static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
}

}  // namespace memfit::offload
