// Lookup of the npm packages scripts/setup.sh unpacks; see npm_package.h.
#include "memfit/io/npm_package.h"

#include <cstdlib>
#include <string>
#include <system_error>
#include <vector>

#include "memfit/core/error.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {
// `start` and its parents, nearest first.
std::vector<fs::path> with_parents(fs::path start) {
  std::vector<fs::path> out;
  while (!start.empty()) {
    out.push_back(start);
    fs::path parent = start.parent_path();
    if (parent == start) break;
    start = parent;
  }
  return out;
}
}  // namespace

fs::path find_npm_package(std::string_view name, std::string_view env_var, std::string_view what) {
  std::string env_name(env_var);
  if (const char* env = std::getenv(env_name.c_str()); env != nullptr && *env != '\0') {
    std::error_code ec;
    if (!fs::is_directory(env, ec))
      MEMFIT_THROW(IoError, "npm", "{} is set to '{}', which is not a folder; it should hold {}",
                   env_name, env, what);
    return fs::path(env);
  }
  fs::path relative = fs::path(".cache") / "npm" / std::string(name) / "package";
  std::vector<fs::path> roots;
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  if (!ec) roots = with_parents(cwd);
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto& p : with_parents(exe.parent_path())) roots.push_back(p);
  }
  for (const auto& root : roots) {
    fs::path candidate = root / relative;
    if (fs::is_directory(candidate, ec)) return candidate;
  }
  MEMFIT_THROW(IoError, "npm",
               "cannot find {} (npm package {}): looked for {} in the current folder, the "
               "memfit executable's folder and their parents; run scripts/setup.sh in the "
               "memfit checkout, or set {} to the folder that holds it",
               what, name, relative.string(), env_name);
}

}  // namespace memfit::io
