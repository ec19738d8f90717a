#include "memfit/train/offload_disk.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/offload/scratch_file.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// FNV-1a over the host name and the device number: equal for ranks that share the filesystem.
uint64_t filesystem_id(const fs::path& dir) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    MEMFIT_THROW(IoError, "offload", "--offload-dir {}: cannot stat the directory", dir.string());
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](std::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  };
  mix(host);
  mix(std::string_view(reinterpret_cast<const char*>(&st.st_dev), sizeof st.st_dev));
  return h;
}

std::string gib(uint64_t bytes) {
  return fmt::format("{} bytes ({:.2f} GiB)", bytes, bytes / 1073741824.0);
}

}  // namespace

std::optional<std::string> disk_shortfall(std::span<const RankDisk> ranks) {
  std::vector<bool> seen(ranks.size(), false);
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (seen[r]) continue;
    uint64_t need = 0, free = ranks[r].free;
    std::vector<size_t> group;
    for (size_t s = r; s < ranks.size(); ++s) {
      if (ranks[s].filesystem != ranks[r].filesystem) continue;
      seen[s] = true;
      group.push_back(s);
      need += ranks[s].need;
      free = std::min(free, ranks[s].free);
    }
    if (need <= free) continue;
    if (ranks.size() == 1)
      return fmt::format("the offload files need {} and the filesystem has {} free", gib(need),
                         gib(free));
    if (group.size() == 1)
      return fmt::format("rank {}'s offload files need {} and its filesystem has {} free",
                         group[0], gib(need), gib(free));
    std::string who;
    for (size_t i = 0; i < group.size(); ++i)
      who += fmt::format("{}{}", i == 0 ? "" : i + 1 == group.size() ? " and " : ", ", group[i]);
    return fmt::format("ranks {} share a filesystem: their offload files need {} together and "
                       "it has {} free",
                       who, gib(need), gib(free));
  }
  return std::nullopt;
}

void check_offload_disk(dist::Communicator& comm, const fs::path& dir, uint64_t need) {
  MEMFIT_CHECK(fs::is_directory(dir), "offload", "--offload-dir {} was not made first",
               dir.string());
  const int W = comm.size();
  std::vector<RankDisk> all(static_cast<size_t>(W));
  all[static_cast<size_t>(comm.rank())] = {filesystem_id(dir), need,
                                           offload::free_disk_bytes(dir)};
  // W small broadcasts: set-up only, and no collective buffer from the pool.
  for (int r = 0; r < W; ++r) comm.broadcast(&all[static_cast<size_t>(r)], sizeof(RankDisk), r);
  if (const auto why = disk_shortfall(all))
    MEMFIT_THROW(IoError, "offload", "--offload-dir {}: {}", dir.string(), *why);
}

}  // namespace memfit
