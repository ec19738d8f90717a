// atomic_file: contents land whole or not at all, and nothing is left behind either way.
#include "memfit/io/atomic_file.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "memfit/core/error.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

using testing::list_dir;
using testing::ScratchDir;

TEST(AtomicFile, WritesAndReplacesLeavingNoTemporaries) {
  ScratchDir dir;
  write_file_atomic(dir / "a.json", std::string_view("{\"x\": 1}\n"));
  EXPECT_EQ(read_file_to_string(dir / "a.json"), "{\"x\": 1}\n");
  write_file_atomic(dir / "a.json", std::string_view("{}"));
  EXPECT_EQ(read_file_to_string(dir / "a.json"), "{}");
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"a.json"});
}

TEST(AtomicFile, StreamsThroughTheCallback) {
  ScratchDir dir;
  uint64_t seen = 0;
  write_file_atomic(dir / "s.bin", [&](FileWriter& w) {
    EXPECT_EQ(w.path(), dir / "s.bin");
    std::string block(100000, 'x');
    for (int i = 0; i < 5; ++i) w.write(block.data(), block.size());
    w.write("end");
    seen = w.bytes_written();
  });
  EXPECT_EQ(seen, 500003u);
  EXPECT_EQ(std::filesystem::file_size(dir / "s.bin"), 500003u);
}

TEST(AtomicFile, AFailingWriterLeavesTheOldFile) {
  ScratchDir dir;
  write_file_atomic(dir / "keep.txt", std::string_view("old"));
  EXPECT_THROW(write_file_atomic(dir / "keep.txt",
                                 [](FileWriter& w) {
                                   w.write("new but half");
                                   throw std::runtime_error("disk on fire");
                                 }),
               std::runtime_error);
  EXPECT_EQ(read_file_to_string(dir / "keep.txt"), "old");
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"keep.txt"});
}

TEST(AtomicFile, ErrorsNameThePathAndTheReason) {
  ScratchDir dir;
  auto missing = dir / "no" / "such" / "dir" / "f.json";
  try {
    write_file_atomic(missing, std::string_view("{}"));
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
    EXPECT_EQ(e.op(), "atomic_file");
  }
  try {
    read_file_to_string(dir / "absent.json");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_file_to_string(dir.path()), IoError);  // a directory is not a file
}

TEST(AtomicFile, FsyncHelpersAcceptFilesAndDirectories) {
  ScratchDir dir;
  write_file_atomic(dir / "f", std::string_view("x"));
  EXPECT_NO_THROW(fsync_file(dir / "f"));
  EXPECT_NO_THROW(fsync_directory(dir.path()));
  EXPECT_THROW(fsync_directory(dir / "missing"), IoError);
}

}  // namespace
}  // namespace memfit::io
