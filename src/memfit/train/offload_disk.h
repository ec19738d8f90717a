// The disk check of an offloaded run (Note [NVMe offload], "A disk too small"): before any
// offload file exists, each rank's files against --disk-limit, and the files of every rank that
// shares a filesystem, together, against its free bytes. Ranks on one host each checking
// alone would all pass and then fail in posix_fallocate, one of them after the others have
// filled the disk.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "memfit/dist/communicator.h"

namespace memfit {

struct RankDisk {
  uint64_t filesystem = 0;  // host and device: ranks with equal values share the free bytes
  uint64_t need = 0;        // this rank's offload files (the planner's disk_bytes)
  uint64_t free = 0;        // the filesystem's free bytes as this rank saw them
};

// The first filesystem (in rank order) whose ranks' files together exceed its free bytes (the
// least any of them saw): "ranks 0 and 1 share a filesystem: their offload files need ..."; with
// one rank, "the offload files need ...". nullopt when every filesystem has room.
std::optional<std::string> disk_shortfall(std::span<const RankDisk> ranks);

// Collective, on the directory `dir` the caller made (io::CreatedDirectories): exchanges every
// rank's RankDisk and throws IoError on every rank alike where disk_shortfall finds one (naming
// `dir`), before a file is made.
void check_offload_disk(dist::Communicator& comm, const std::filesystem::path& dir,
                        uint64_t need);

}  // namespace memfit
