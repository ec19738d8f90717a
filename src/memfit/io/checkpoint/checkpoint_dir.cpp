// The atomic directory swap behind every checkpoint save, and the loader's side of it. See
// checkpoint_dir.h and docs/notes/checkpoints.md, "Atomic checkpoint directories".
#include "memfit/io/checkpoint/checkpoint_dir.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kOp = "checkpoint";

// Absolute, normalized, without a trailing separator, so siblings can be named from it.
fs::path normalize(const fs::path& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  if (ec) MEMFIT_THROW(IoError, kOp, "cannot resolve {}: {}", dir.string(), ec.message());
  p = p.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (!p.has_filename() || p.filename() == "." || p.filename() == "..")
    MEMFIT_THROW(IoError, kOp, "'{}' cannot be a checkpoint directory", dir.string());
  return p;
}

fs::path sibling(const fs::path& dir, std::string_view suffix) {
  return dir.parent_path() / (dir.filename().string() + std::string(suffix));
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int err = errno;
    MEMFIT_THROW(IoError, kOp, "cannot rename {} to {}: {}", from.string(), to.string(),
                 std::strerror(err));
  }
}

void remove_all_or_throw(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) MEMFIT_THROW(IoError, kOp, "cannot remove {}: {}", p.string(), ec.message());
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// Every file and directory below `dir`, then `dir` itself: durable whoever wrote them.
void fsync_tree(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec))
      fsync_file(it->path());
    else if (it->is_directory(ec))
      dirs.push_back(it->path());
  }
  if (ec) MEMFIT_THROW(IoError, kOp, "cannot list {}: {}", dir.string(), ec.message());
  for (const fs::path& d : dirs) fsync_directory(d);
  fsync_directory(dir);
}

// The pid in a DIR.tmp-<pid> name, or -1 if `name` is not one.
int64_t temp_pid(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t pid = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9' || pid > (int64_t{1} << 40)) return -1;
    pid = pid * 10 + (c - '0');
  }
  return pid;
}

std::vector<fs::path> temp_dirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::string prefix = dir.filename().string() + ".tmp-";
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir.parent_path(), ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (temp_pid(it->path().filename().string(), prefix) >= 0) out.push_back(it->path());
  return out;
}

// Unfinished saves of this process or of processes that are gone. A live process's is left
// alone: it may be saving now (a pid reused by an unrelated process only leaves litter).
void remove_stale_temps(const fs::path& dir) {
  std::string prefix = dir.filename().string() + ".tmp-";
  for (const fs::path& p : temp_dirs(dir)) {
    int64_t pid = temp_pid(p.filename().string(), prefix);
    bool gone = pid == ::getpid() || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
    if (gone) remove_all_or_throw(p);
  }
}

}  // namespace

std::string_view save_stage_name(SaveStage stage) {
  switch (stage) {
    case SaveStage::temp_created:
      return "temp_created";
    case SaveStage::model_written:
      return "model_written";
    case SaveStage::files_written:
      return "files_written";
    case SaveStage::old_moved_aside:
      return "old_moved_aside";
    case SaveStage::new_in_place:
      return "new_in_place";
    case SaveStage::old_removed:
      return "old_removed";
  }
  return "?";
}

fs::path checkpoint_old_path(const fs::path& dir) { return sibling(normalize(dir), ".old"); }

fs::path checkpoint_temp_path(const fs::path& dir, int64_t pid) {
  return sibling(normalize(dir), ".tmp-" + std::to_string(pid));
}

namespace {

// What write_directory_atomic refuses before it writes anything: a parent it cannot create, a
// DIR that is not a directory, a DIR that is not empty and not a checkpoint.
void check_target(const fs::path& dir, std::initializer_list<std::string_view> marker_files) {
  const fs::path parent = dir.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) MEMFIT_THROW(IoError, kOp, "cannot create {}: {}", parent.string(), ec.message());
  if (path_exists(dir)) {
    if (!fs::is_directory(dir, ec))
      MEMFIT_THROW(IoError, kOp, "{} exists and is not a directory; not replacing it",
                   dir.string());
    bool marked = false;
    std::string names;
    for (std::string_view m : marker_files) {
      marked |= path_exists(dir / m);
      names += (names.empty() ? "" : " or ") + std::string(m);
    }
    if (!fs::is_empty(dir, ec) && !marked)
      MEMFIT_THROW(IoError, kOp,
                   "{} is not empty and holds no {}, so it is not a checkpoint; not replacing it "
                   "(choose another directory or empty this one)",
                   dir.string(), names);
  }
}

}  // namespace

void check_directory_writable(const fs::path& dir_in,
                              std::initializer_list<std::string_view> marker_files) {
  const fs::path dir = normalize(dir_in);
  check_target(dir, marker_files);
  // The save's first write, tried and undone: the temporary sibling it would create.
  const fs::path tmp = sibling(dir, ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  if (!fs::create_directory(tmp, ec) || ec)
    MEMFIT_THROW(IoError, kOp, "cannot write beside {}: cannot create {}: {}", dir.string(),
                 tmp.string(), ec ? ec.message() : std::string("it already exists"));
  fs::remove(tmp, ec);
}

void write_directory_atomic(const fs::path& dir_in,
                            const std::function<void(const fs::path& temp_dir)>& fill,
                            const std::function<void(SaveStage)>& on_stage,
                            std::initializer_list<std::string_view> marker_files) {
  const fs::path dir = normalize(dir_in);
  const fs::path parent = dir.parent_path();
  const fs::path old = sibling(dir, ".old");
  const fs::path tmp = sibling(dir, ".tmp-" + std::to_string(::getpid()));
  auto stage = [&](SaveStage s) {
    if (on_stage) on_stage(s);
  };

  check_target(dir, marker_files);
  std::error_code ec;
  remove_stale_temps(dir);

  bool moved_aside = false;
  try {
    if (!fs::create_directory(tmp, ec) || ec)
      MEMFIT_THROW(IoError, kOp, "cannot create {}: {}", tmp.string(),
                   ec ? ec.message() : std::string("it already exists"));
    stage(SaveStage::temp_created);
    fill(tmp);
    fsync_tree(tmp);
    fsync_directory(parent);
    stage(SaveStage::files_written);

    // DIR, when present, is always complete (it only ever appears by renaming a finished
    // temporary directory), so a DIR.old beside it is an older checkpoint and can go.
    if (path_exists(dir)) {
      if (path_exists(old)) remove_all_or_throw(old);
      rename_or_throw(dir, old);
      fsync_directory(parent);
      moved_aside = true;
      stage(SaveStage::old_moved_aside);
    }
    rename_or_throw(tmp, dir);
    fsync_directory(parent);
    stage(SaveStage::new_in_place);
    if (path_exists(old)) {
      remove_all_or_throw(old);
      fsync_directory(parent);
    }
    stage(SaveStage::old_removed);
  } catch (...) {
    // Roll back to where we started; best effort, the original error is the one to report.
    std::error_code ignored;
    if (moved_aside && !path_exists(dir) && path_exists(old))
      (void)::rename(old.c_str(), dir.c_str());
    fs::remove_all(tmp, ignored);
    try {
      fsync_directory(parent);
    } catch (const IoError&) {
    }
    throw;
  }
}

CheckpointLocation locate_checkpoint(const fs::path& dir_in) {
  const fs::path dir = normalize(dir_in);
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return {dir, false, ""};
  if (path_exists(dir)) MEMFIT_THROW(IoError, kOp, "{} is not a directory", dir.string());
  const fs::path old = sibling(dir, ".old");
  if (fs::is_directory(old, ec)) {
    std::string note = fmt::format(
        "checkpoint {} is missing but {} holds the previous complete checkpoint (a save was "
        "interrupted between its two renames); loading {}. The next save to {} tidies up.",
        dir.string(), old.string(), old.string(), dir.string());
    return {old, true, std::move(note)};
  }
  std::string temps;
  for (const fs::path& p : temp_dirs(dir)) temps += (temps.empty() ? "" : ", ") + p.string();
  MEMFIT_THROW(IoError, kOp, "no checkpoint at {} (nor {}){}", dir.string(), old.string(),
               temps.empty()
                   ? std::string()
                   : fmt::format("; {} holds an unfinished save, which is never loaded", temps));
}

}  // namespace memfit::io
