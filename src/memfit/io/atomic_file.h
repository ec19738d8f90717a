// Atomic file writes: a reader (or a crash) sees either the old file or the whole new one, never
// a torn one. Every file memfit writes that someone might read back (checkpoints, configs,
// trainer state) goes through here. The recipe: write to a temporary name in the same
// directory, fsync the file, rename it over the target, fsync the directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace memfit::io {

// The open temporary file that write_file_atomic hands to its callback. Writes are unbuffered
// (each call is a write(2) loop), so pass large blocks; errors throw IoError naming the target.
class FileWriter {
 public:
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Extends the file by `n` bytes (zeros until written) and moves past them: a region that
  // write_at fills in any order (a tensor written scattered, SafetensorsWriter::add_scattered).
  void skip(uint64_t n);
  // Writes `n` bytes at byte `offset` of the file, which must lie within what write() and
  // skip() have covered; the position write() continues from does not move (pwrite(2)).
  void write_at(uint64_t offset, const void* data, size_t n);
  // The bytes covered so far (written, or skipped).
  uint64_t bytes_written() const { return written_; }
  // The path the file will have once complete (not the temporary name).
  const std::filesystem::path& path() const { return target_; }

 private:
  friend void write_file_atomic(const std::filesystem::path&,
                                const std::function<void(FileWriter&)>&);
  FileWriter(int fd, std::filesystem::path target) : fd_(fd), target_(std::move(target)) {}
  int fd_;
  std::filesystem::path target_;
  uint64_t written_ = 0;
};

// Writes `path` atomically with bytes streamed by `fill`. If `fill` throws or any system call
// fails, the temporary file is removed, `path` is left as it was, and the error propagates
// (system failures as IoError naming the path and the errno text).
void write_file_atomic(const std::filesystem::path& path,
                       const std::function<void(FileWriter&)>& fill);
// Writes `path` atomically with `contents` (a JSON document, say).
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// fsync a directory, so that names created, renamed or removed in it are durable.
void fsync_directory(const std::filesystem::path& dir);
// fsync an existing file by name (for files written by code that did not sync them).
void fsync_file(const std::filesystem::path& path);

// The whole of a small file (a JSON config) as a string; IoError naming the path if unreadable.
std::string read_file_to_string(const std::filesystem::path& path);

}  // namespace memfit::io
