#include "memfit/io/created_directories.h"

#include "memfit/core/error.h"

namespace memfit::io {

namespace fs = std::filesystem;

void CreatedDirectories::create(const fs::path& dir, std::string_view op, std::string_view what) {
  // The missing ancestors, outermost first, each made by create_directory, which says whether
  // this call made it: two ranks making one --profile DIR each remember only their own.
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = dir.lexically_normal(); !p.empty() && !fs::exists(fs::symlink_status(p, ec));
       p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (fs::create_directory(*it, ec))
      made_.push_back(*it);
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

CreatedDirectories::~CreatedDirectories() {
  std::error_code ec;
  // remove() takes a directory only while it is empty; one that is not stops the walk outward.
  for (auto it = made_.rbegin(); it != made_.rend(); ++it)
    if (!fs::remove(*it, ec)) break;
}

}  // namespace memfit::io
