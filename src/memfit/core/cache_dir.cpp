#include "memfit/core/cache_dir.h"

#include <cstdlib>

namespace memfit {

namespace fs = std::filesystem;

fs::path calibration_cache_dir() {
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
  };
  if (const char* d = env("MEMFIT_CACHE_DIR")) return d;
  if (const char* d = env("XDG_CACHE_HOME")) return fs::path(d) / "memfit";
  if (const char* h = env("HOME")) return fs::path(h) / ".cache" / "memfit";
  return fs::temp_directory_path() / "memfit-cache";
}

}  // namespace memfit
