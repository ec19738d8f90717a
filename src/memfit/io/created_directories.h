// The directories a run makes for its output (--profile, --offload-dir and a rank's subdirectory
// of either), undone when the run ends: each one this object made goes again, deepest first, if
// it is empty by then. A run refused after it made them (out of memory, a disk too small, a
// failed step) leaves no empty directory behind, and one that wrote output keeps it: a
// directory that holds anything, or that existed before, is never removed.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

namespace memfit::io {

class CreatedDirectories {
 public:
  CreatedDirectories() = default;
  CreatedDirectories(const CreatedDirectories&) = delete;
  CreatedDirectories& operator=(const CreatedDirectories&) = delete;
  ~CreatedDirectories();

  // Makes `dir` and whichever of its parents are missing, remembering those this call made (not
  // one another process made first). IoError in `op`, "{what}: cannot create the directory
  // {dir}: ...", where it cannot, or where a file is in the way.
  void create(const std::filesystem::path& dir, std::string_view op, std::string_view what);

  // The directories `dir` needs made, outermost first (none where it exists).
  static std::vector<std::filesystem::path> missing(const std::filesystem::path& dir);
  // Remembers `dirs` as made by this run though another of its processes may have made them:
  // each goes again at the end if empty, as those this object made. Ranks that each take
  // missing() of one directory before any of them makes it (a barrier between) and adopt it
  // leave nothing behind whichever ends last; create's own record alone leaves the shared
  // parent to the rank that made it, which may end before the others empty it.
  void adopt(const std::vector<std::filesystem::path>& dirs);

 private:
  std::vector<std::filesystem::path> made_;  // in the order made: outermost first
};

// `dir` where it exists, else its nearest ancestor that does: the filesystem a directory not yet
// made would be made on (such a path cannot be a mount point). What the planner asks about an
// --offload-dir (its free bytes, its device) without making it.
std::filesystem::path existing_ancestor(const std::filesystem::path& dir);

}  // namespace memfit::io
