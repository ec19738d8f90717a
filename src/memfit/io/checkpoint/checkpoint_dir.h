// Atomic checkpoint directories: a save into DIR never leaves a half-written checkpoint, and a
// crash at any point leaves a complete one (old or new) that the loader finds. Files are written
// into a fresh sibling DIR.tmp-<pid>, fsynced, then swapped in with two renames
// (DIR -> DIR.old, DIR.tmp-<pid> -> DIR) and DIR.old removed. Model-agnostic: the GPT-2
// checkpoints (model_checkpoint.h) fill the directory through a callback.
// The design and its crash analysis: docs/notes/checkpoints.md, "Atomic checkpoint directories".
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

namespace memfit::io {

// The points of a save, in order. Hooks are called after each (fault injection for tests).
enum class SaveStage : uint8_t {
  temp_created,     // DIR.tmp-<pid>/ exists, empty
  model_written,    // the model file is in the temporary directory (reported by the filler)
  files_written,    // every file written and fsynced there; DIR untouched so far
  old_moved_aside,  // DIR renamed to DIR.old (only when DIR existed)
  new_in_place,     // the temporary directory renamed to DIR
  old_removed,      // DIR.old removed (if there was one): the save is complete
};
std::string_view save_stage_name(SaveStage stage);

// Writes the directory `dir` atomically. `fill` writes the files into the temporary directory
// it is given (any way it likes: everything there is fsynced before the swap). `on_stage`, if
// set, is called after each stage; if it (or anything) throws, the save is rolled back: the
// temporary directory is removed and, if DIR had been moved aside, DIR.old is renamed back, so
// DIR is as before; then the error propagates. A test that wants a crash, not a failure, exits
// the process from on_stage instead.
// DIR's parent is created if missing. A DIR that exists but is not a directory, or is not empty
// and holds none of `marker_files` (so is not a checkpoint this code wrote), is refused with an
// IoError rather than replaced. Unfinished DIR.tmp-<pid> directories of processes no longer
// alive are removed first. One saver per DIR at a time.
void write_directory_atomic(const std::filesystem::path& dir,
                            const std::function<void(const std::filesystem::path& temp_dir)>& fill,
                            const std::function<void(SaveStage)>& on_stage = {},
                            std::initializer_list<std::string_view> marker_files = {
                                "model.safetensors"});

// What write_directory_atomic(dir, ..., marker_files) would refuse, checked before the work
// whose result it saves (a run checks its --save before step 1): DIR's parent is created if
// missing, and the temporary sibling a save creates first is created and removed. IoError
// naming the path otherwise.
void check_directory_writable(const std::filesystem::path& dir,
                              std::initializer_list<std::string_view> marker_files = {
                                  "model.safetensors"});

// Where a checkpoint's files are.
struct CheckpointLocation {
  std::filesystem::path dir;  // DIR, or DIR.old when recovered
  bool recovered = false;     // DIR was missing and DIR.old, left by an interrupted save, is used
  std::string note;           // for the user when recovered: what happened and what is loaded
};
// DIR if it is a directory; else DIR.old (recovered, with a note) if a save was interrupted
// between its two renames; else IoError (which mentions unfinished DIR.tmp-* directories: they
// are never loaded). Changes nothing on disk: the next save tidies up.
CheckpointLocation locate_checkpoint(const std::filesystem::path& dir);

// The sibling paths a save uses, for tests and tools: DIR.old and DIR.tmp-<pid>.
std::filesystem::path checkpoint_old_path(const std::filesystem::path& dir);
std::filesystem::path checkpoint_temp_path(const std::filesystem::path& dir, int64_t pid);

}  // namespace memfit::io
