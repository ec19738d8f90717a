// Runs a libFuzzer harness over the files it is given (folders: their files, in name order),
// once each, in place of libFuzzer's driver: the seed corpus as a test of the ordinary build
// (fuzz/replay.cmake). The harness refuses bad input by catching memfit::Error; anything else
// (a crash, a sanitizer report, another exception) ends this process and fails the test.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (!fs::is_directory(arg)) {
      inputs.push_back(arg);
      continue;
    }
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(arg))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    inputs.insert(inputs.end(), files.begin(), files.end());
  }
  // An empty corpus would pass without running the harness once: a test that checks nothing.
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs (usage: %s FILE_OR_FOLDER...)\n", argv[0]);
    return 2;
  }
  for (const fs::path& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
      return 2;
    }
    const std::string bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  // The harnesses' scratch files (fuzz/fuzz_util.h: one folder a process).
  std::error_code ec;
  fs::remove_all(fs::temp_directory_path() / ("memfit_fuzz_" + std::to_string(::getpid())), ec);
  std::printf("replayed %zu inputs\n", inputs.size());
  return 0;
}
