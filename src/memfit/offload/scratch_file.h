// One offload file: scratch, not a checkpoint. It starts with a page of header (JSON, padded)
// naming the run, the tensor, the layout it was written for and the last step written, so a
// file left behind by a crash says whose it is; the run removes its files when it ends. Opened
// with O_DIRECT where the filesystem allows it (tmpfs does not: then buffered, said once), and
// its whole size reserved up front, so a full disk shows before the first step, not in it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memfit::offload {

// A file's cut points (where each piece, block or unit starts) for its header: their count and
// an FNV-1a digest of the list, so the header stays within its page whatever the model (a 7B
// model's optimizer files have thousands of pieces) and still tells layouts apart.
nlohmann::json cut_points(const std::vector<int64_t>& starts);

class ScratchFile {
 public:
  // Creates (truncating) `path` of `bytes` bytes, reserved with posix_fallocate (IoError naming
  // the file and errno on failure), the data reading as zeros; writes the header.
  ScratchFile(std::filesystem::path path, uint64_t bytes, nlohmann::json header);
  ~ScratchFile();  // closes and removes the file
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  bool direct() const { return direct_; }
  // Rewrites the header with header["step"] = step (after an update has been written).
  void set_step(int64_t step);
  // The header of the file at `path` (for tests and for a person looking at a leftover file).
  static nlohmann::json read_header(const std::filesystem::path& path);

 private:
  void write_header();

  std::filesystem::path path_;
  uint64_t bytes_;
  nlohmann::json header_;
  int fd_ = -1;
  bool direct_ = false;
};

// Bytes free to an unprivileged writer on the filesystem holding `dir` (statvfs's f_bavail), or
// that would hold it: a `dir` not made yet is not made (io::existing_ancestor).
uint64_t free_disk_bytes(const std::filesystem::path& dir);

}  // namespace memfit::offload
