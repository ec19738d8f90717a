// What the libFuzzer harnesses share: a scratch file per process for parsers that take a path,
// and the one rule every harness checks. A parser of outside bytes may refuse its input only by
// throwing memfit::Error (IoError or ConfigError naming the file and field); a crash, a
// sanitizer report, a hang or any other exception is a bug. See docs/testing.md.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace memfit::fuzz {

// A folder of this process's own under the temporary directory, made once.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("memfit_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/`name` (replacing it) and returns the path.
inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
  auto path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace memfit::fuzz
