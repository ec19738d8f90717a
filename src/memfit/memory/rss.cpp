#include "memfit/memory/rss.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>

namespace memfit {

size_t process_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  const long page = ::sysconf(_SC_PAGESIZE);
  return n == 2 && page > 0 ? static_cast<size_t>(resident) * static_cast<size_t>(page) : 0;
}

size_t mapping_rss_bytes(const void* addr) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  const auto at = reinterpret_cast<uintptr_t>(addr);
  char line[512];
  bool inside = false;
  size_t rss = 0;
  // Each mapping is a header line "start-end perms ..." followed by "Key: value kB" lines; the
  // first "Rss:" after the header of the mapping that holds `addr` is the answer.
  while (std::fgets(line, sizeof line, f)) {
    uintmax_t start = 0, end = 0;
    if (std::sscanf(line, "%" SCNxMAX "-%" SCNxMAX " ", &start, &end) == 2) {
      inside = start <= at && at < end;
      continue;
    }
    unsigned long kib = 0;
    if (inside && std::sscanf(line, "Rss: %lu kB", &kib) == 1) {
      rss = static_cast<size_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return rss;
}

}  // namespace memfit
