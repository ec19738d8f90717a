#include "memfit/io/created_directories.h"

#include <algorithm>
#include <iterator>

#include "memfit/core/error.h"

namespace memfit::io {

namespace fs = std::filesystem;

std::vector<fs::path> CreatedDirectories::missing(const fs::path& dir) {
  std::vector<fs::path> innermost_first;
  std::error_code ec;
  for (fs::path p = dir.lexically_normal(); !p.empty() && !fs::exists(fs::symlink_status(p, ec));
       p = p.parent_path()) {
    innermost_first.push_back(p);
    if (p == p.parent_path()) break;
  }
  return {innermost_first.rbegin(), innermost_first.rend()};
}

void CreatedDirectories::create(const fs::path& dir, std::string_view op, std::string_view what) {
  // The missing ancestors, outermost first, each made by create_directory, which says whether
  // this call made it: two ranks making one --profile DIR each remember only their own.
  std::error_code ec;
  for (const fs::path& p : missing(dir)) {
    if (fs::create_directory(p, ec))
      made_.push_back(p);
    else if (ec)
      break;
  }
  if (ec || !fs::is_directory(dir))
    MEMFIT_THROW(IoError, op, "{}: cannot create the directory {}: {}", what,
                 dir.string(), ec ? ec.message() : "a file is in the way");
}

fs::path existing_ancestor(const fs::path& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  while (!fs::exists(p, ec) && p.has_relative_path()) p = p.parent_path();
  return p;
}

void CreatedDirectories::adopt(const std::vector<fs::path>& dirs) {
  for (const fs::path& d : dirs)
    if (std::find(made_.begin(), made_.end(), d) == made_.end()) made_.push_back(d);
  // Outermost first: a path's components count its depth.
  std::stable_sort(made_.begin(), made_.end(), [](const fs::path& a, const fs::path& b) {
    return std::distance(a.begin(), a.end()) < std::distance(b.begin(), b.end());
  });
}

CreatedDirectories::~CreatedDirectories() {
  std::error_code ec;
  // remove() takes a directory only while it is empty; one that is not stops the walk outward.
  // One already gone (another rank's, adopted) is passed over.
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    fs::remove(*it, ec);
    if (ec) break;
  }
}

}  // namespace memfit::io
