// Atomic checkpoint directories: at every stage of a save, a failure rolls back to the old
// checkpoint and a crash leaves a complete one (old or new) that locate_checkpoint finds.
// Crashes are real: a forked child saves and _exit()s from the stage hook.
#include "memfit/io/checkpoint/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using testing::list_dir;
using testing::ScratchDir;

constexpr SaveStage kStages[] = {SaveStage::temp_created, SaveStage::files_written,
                                 SaveStage::old_moved_aside, SaveStage::new_in_place,
                                 SaveStage::old_removed};

// A stand-in checkpoint: the marker file holds a version string, plus a second file.
void save_version(const fs::path& dir, const std::string& version,
                  const std::function<void(SaveStage)>& on_stage = {}) {
  write_directory_atomic(
      dir,
      [&](const fs::path& tmp) {
        write_file_atomic(tmp / "model.safetensors", std::string_view(version));
        write_file_atomic(tmp / "trainer_state.json", "{\"v\": \"" + version + "\"}");
      },
      on_stage);
}

std::string version_at(const fs::path& dir) {
  return read_file_to_string(dir / "model.safetensors");
}

// Runs a save of `version` in a child process that dies (no cleanup, no unwinding) right after
// `crash_at`. Returns true if the child reached that stage.
bool crash_during_save(const fs::path& dir, const std::string& version, SaveStage crash_at) {
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      save_version(dir, version, [&](SaveStage s) {
        if (s == crash_at) ::_exit(0);
      });
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(2);  // finished without passing the stage
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(CheckpointDir, SavesAndReplacesLeavingNothingBehind) {
  ScratchDir root;
  fs::path dir = root / "ckpt";
  save_version(dir, "v1");
  EXPECT_EQ(version_at(dir), "v1");
  save_version(dir, "v2");
  EXPECT_EQ(version_at(dir), "v2");
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"model.safetensors", "trainer_state.json"}));
  CheckpointLocation at = locate_checkpoint(dir);
  EXPECT_EQ(at.dir, fs::absolute(dir));
  EXPECT_FALSE(at.recovered);
  // A trailing slash and a missing parent are fine.
  save_version(root / "a" / "b" / "ckpt/", "v3");
  EXPECT_EQ(version_at(root / "a" / "b" / "ckpt"), "v3");
}

TEST(CheckpointDir, AFailureAtAnyStageLeavesTheOldCheckpoint) {
  ScratchDir root;
  fs::path dir = root / "ckpt";
  save_version(dir, "old");
  for (SaveStage stage : kStages) {
    SCOPED_TRACE(std::string(save_stage_name(stage)));
    EXPECT_THROW(save_version(dir, "new",
                              [&](SaveStage s) {
                                if (s == stage) throw std::runtime_error("injected");
                              }),
                 std::runtime_error);
    std::string expected = stage >= SaveStage::new_in_place ? "new" : "old";
    EXPECT_EQ(version_at(dir), expected);
    // No temporary directory survives a failure; DIR.old only if the swap had completed.
    for (const std::string& name : list_dir(root.path()))
      EXPECT_TRUE(name == "ckpt" || (name == "ckpt.old" && stage == SaveStage::new_in_place))
          << name;
    save_version(dir, "old");  // back to the start for the next stage
    EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
  }
}

TEST(CheckpointDir, ACrashAtAnyStageLeavesACompleteCheckpoint) {
  ScratchDir root;
  fs::path dir = root / "ckpt";
  for (SaveStage stage : kStages) {
    SCOPED_TRACE(std::string(save_stage_name(stage)));
    save_version(dir, "old");
    ASSERT_TRUE(crash_during_save(dir, "new", stage));
    CheckpointLocation at = locate_checkpoint(dir);
    bool new_visible = stage >= SaveStage::new_in_place;
    EXPECT_EQ(version_at(at.dir), new_visible ? "new" : "old");
    EXPECT_EQ(read_file_to_string(at.dir / "trainer_state.json"),
              new_visible ? "{\"v\": \"new\"}" : "{\"v\": \"old\"}");
    EXPECT_EQ(at.recovered, stage == SaveStage::old_moved_aside);
    if (at.recovered) {
      EXPECT_EQ(at.dir, checkpoint_old_path(dir));
      EXPECT_NE(at.note.find("interrupted"), std::string::npos) << at.note;
      EXPECT_NE(at.note.find("ckpt.old"), std::string::npos) << at.note;
    }
    // The next save tidies up whatever the crash left (the dead child's DIR.tmp-<pid>, DIR.old).
    save_version(dir, "next");
    EXPECT_EQ(version_at(dir), "next");
    EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
  }
}

TEST(CheckpointDir, ACrashWhileWritingFilesLeavesTheOldCheckpoint) {
  ScratchDir root;
  fs::path dir = root / "ckpt";
  save_version(dir, "old");
  pid_t pid = ::fork();
  if (pid == 0) {
    write_directory_atomic(dir, [](const fs::path& tmp) {
      std::ofstream(tmp / "model.safetensors") << "half a mod";
      ::_exit(0);
    });
    ::_exit(2);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(version_at(locate_checkpoint(dir).dir), "old");
  EXPECT_EQ(list_dir(root.path()).size(), 2u);  // ckpt and the dead child's ckpt.tmp-<pid>
  EXPECT_TRUE(fs::exists(checkpoint_temp_path(dir, pid)));
  save_version(dir, "new");
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointDir, LeavesALiveProcesssTemporaryDirectoryAlone) {
  ScratchDir root;
  fs::path dir = root / "ckpt";
  fs::create_directories(checkpoint_temp_path(dir, 1));  // pid 1 is alive
  save_version(dir, "v");
  EXPECT_TRUE(fs::exists(checkpoint_temp_path(dir, 1)));
}

TEST(CheckpointDir, RefusesToReplaceWhatIsNotACheckpoint) {
  ScratchDir root;
  fs::create_directories(root / "home");
  write_file_atomic(root / "home" / "thesis.tex", std::string_view("precious"));
  try {
    save_version(root / "home", "v");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("not a checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find("home"), std::string::npos) << msg;
  }
  EXPECT_EQ(read_file_to_string(root / "home" / "thesis.tex"), "precious");
  write_file_atomic(root / "file", std::string_view("x"));
  EXPECT_THROW(save_version(root / "file", "v"), IoError);
  // An empty directory is fine to fill.
  fs::create_directories(root / "empty");
  save_version(root / "empty", "v");
  EXPECT_EQ(version_at(root / "empty"), "v");
}

TEST(CheckpointDir, LocatingNothingSaysWhatIsThere) {
  ScratchDir root;
  fs::path dir = root / "ckpt";
  try {
    locate_checkpoint(dir);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint at"), std::string::npos) << e.what();
  }
  fs::create_directories(checkpoint_temp_path(dir, 1));
  try {
    locate_checkpoint(dir);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt.tmp-1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never loaded"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit::io
