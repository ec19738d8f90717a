// The disk's read and write rates under offload's own I/O (O_DIRECT requests of a few MiB, several
// in flight, through the engine offload uses), measured with a short test in the offload
// directory: the planner's step-time model prices an offloaded update's I/O with them. Cached
// per filesystem (its device number) in the calibration cache (plan/calibration.h), so a
// directory is measured once per machine. Note [NVMe offload] (docs/notes/offload.md).
#pragma once

#include <cstdint>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace memfit::offload {

struct DiskRate {
  double read_bytes_per_s = 0, write_bytes_per_s = 0;
  uint64_t bytes = 0;  // moved each way by the test
  // Seconds to read `read` bytes and write `written` bytes, one after the other.
  double seconds(double read, double written) const {
    return read / read_bytes_per_s + written / write_bytes_per_s;
  }
};

// Writes then reads `bytes` (rounded to 4 KiB) in a scratch file in `dir` and times both.
DiskRate measure_disk_rate(const std::filesystem::path& dir, uint64_t bytes = uint64_t{64} << 20);

// The rate of the filesystem holding `dir`: remembered in the process, else read from
// <calibration cache>/disk-<device>.json, else measured (saying so in one line on stderr) and
// saved there; nothing is created in `dir` (the test file goes in its nearest existing
// ancestor). `remeasure`: measure and save even if known
// (`memfit calibrate --offload-dir`).
const DiskRate& disk_rate(const std::filesystem::path& dir, bool remeasure = false);
// Where disk_rate caches the rate of the filesystem holding `dir`.
std::filesystem::path disk_rate_cache_path(const std::filesystem::path& dir);

}  // namespace memfit::offload
