// Atomic writes through POSIX calls (open/write/fsync/rename), since std::ofstream can neither
// fsync nor report errno. See atomic_file.h for the recipe.
#include "memfit/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "memfit/core/error.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

fs::path directory_of(const fs::path& path) {
  fs::path dir = path.parent_path();
  return dir.empty() ? fs::path(".") : dir;
}

// A name in the same directory as `path` (so rename is atomic) that no other writer uses:
// hidden, with the pid and a per-process counter.
fs::path temporary_name(const fs::path& path) {
  static std::atomic<uint64_t> counter{0};
  std::string name =
      fmt::format(".{}.tmp-{}-{}", path.filename().string(), ::getpid(), counter.fetch_add(1));
  return directory_of(path) / name;
}

}  // namespace

void FileWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      MEMFIT_THROW(IoError, "atomic_file", "writing {} failed after {} bytes: {}", target_.string(),
                   written_, errno_text(err));
    }
    p += k;
    n -= static_cast<size_t>(k);
    written_ += static_cast<uint64_t>(k);
  }
}
void FileWriter::skip(uint64_t n) {
  if (n == 0) return;
  const uint64_t end = written_ + n;
  if (::ftruncate(fd_, static_cast<off_t>(end)) != 0 ||
      ::lseek(fd_, static_cast<off_t>(end), SEEK_SET) < 0) {
    int err = errno;
    MEMFIT_THROW(IoError, "atomic_file", "extending {} to {} bytes failed: {}", target_.string(),
                 end, errno_text(err));
  }
  written_ = end;
}

void FileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  MEMFIT_CHECK(offset <= written_ && n <= written_ - offset, "atomic_file",
               "{}: a write of {} bytes at {} lies past the {} bytes covered", target_.string(), n,
               offset, written_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (k < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      MEMFIT_THROW(IoError, "atomic_file", "writing {} bytes at offset {} of {} failed: {}", n,
                   offset, target_.string(), errno_text(err));
    }
    p += k;
    n -= static_cast<size_t>(k);
    offset += static_cast<uint64_t>(k);
  }
}

void write_file_atomic(const fs::path& path, const std::function<void(FileWriter&)>& fill) {
  MEMFIT_CHECK(path.has_filename(), "atomic_file", "'{}' names no file", path.string());
  const fs::path tmp = temporary_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    MEMFIT_THROW(IoError, "atomic_file", "cannot create temporary file {} for {}: {}", tmp.string(),
                 path.string(), errno_text(err));
  }
  auto fail = [&](const char* what) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    MEMFIT_THROW(IoError, "atomic_file", "{} {} failed: {}", what, path.string(), errno_text(err));
  };
  try {
    FileWriter writer(fd, path);
    fill(writer);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(fd) != 0) fail("fsync of");
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) fail("close of");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename into");
  fsync_directory(directory_of(path));
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  write_file_atomic(path, [&](FileWriter& w) { w.write(contents); });
}

void fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    MEMFIT_THROW(IoError, "atomic_file", "cannot open directory {} to fsync it: {}", dir.string(),
                 errno_text(err));
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    MEMFIT_THROW(IoError, "atomic_file", "fsync of directory {} failed: {}", dir.string(),
                 errno_text(err));
}

void fsync_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    MEMFIT_THROW(IoError, "atomic_file", "cannot open {} to fsync it: {}", path.string(),
                 errno_text(err));
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    MEMFIT_THROW(IoError, "atomic_file", "fsync of {} failed: {}", path.string(), errno_text(err));
}

std::string read_file_to_string(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    MEMFIT_THROW(IoError, "file", "cannot open {}: {}", path.string(), errno_text(err));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      MEMFIT_THROW(IoError, "file", "reading {} failed: {}", path.string(), errno_text(err));
    }
    if (k == 0) break;
    out.append(buf, static_cast<size_t>(k));
  }
  ::close(fd);
  return out;
}

}  // namespace memfit::io
