// Shared by the planner's tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

namespace memfit::test {

// A directory without shards, one per test program (named by `tag` and the process), removed at
// exit: plans then count the data loaders' fixed buffers only, and no data is read.
inline std::string empty_data_dir(const char* tag) {
  struct Dir {
    std::filesystem::path path;
    explicit Dir(const char* t)
        : path(std::filesystem::temp_directory_path() /
               fmt::format("memfit_{}_{}", t, ::getpid())) {
      std::filesystem::create_directories(path);
    }
    ~Dir() { std::filesystem::remove_all(path); }
  };
  static const Dir dir(tag);
  return dir.path.string();
}

}  // namespace memfit::test
