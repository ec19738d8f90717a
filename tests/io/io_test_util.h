// Helpers shared by the io tests: a scratch folder that removes itself, where the npm packages
// are, reading a whole file and comparing two.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <fstream>
#include <sstream>
#include <string>

namespace memfit::io::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it at scope end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/memfit_io_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// The unpacked npm package `name` in this checkout (scripts/setup.sh), or empty if absent.
inline std::filesystem::path npm_package_dir(const std::string& name) {
  std::filesystem::path dir =
      std::filesystem::path(MEMFIT_SOURCE_DIR) / ".cache" / "npm" / name / "package";
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) ? dir : std::filesystem::path();
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Empty when the two files hold the same bytes, else where they first differ (for EXPECT_EQ(..., "")).
inline std::string first_difference(const std::filesystem::path& a, const std::filesystem::path& b) {
  const std::string x = read_file(a), y = read_file(b);
  if (x == y) return "";
  size_t i = 0;
  while (i < x.size() && i < y.size() && x[i] == y[i]) ++i;
  return a.string() + " (" + std::to_string(x.size()) + " bytes) and " + b.string() + " (" +
         std::to_string(y.size()) + " bytes) differ from byte " + std::to_string(i);
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

}  // namespace memfit::io::testing
