// The progress line: updated in place on a terminal, one plain line per update otherwise
// (logs, pipes, CI), so long runs show step, loss, speed, time left and memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace memfit {

class Progress {
 public:
  // `every`: plain lines are printed every `every` updates (a terminal gets all of them).
  Progress(int64_t total, std::FILE* out = stderr, int64_t every = 1);
  bool is_tty() const { return tty_; }
  // Shows `text` for step `done` of total, with the ETA from the elapsed time.
  void update(int64_t done, const std::string& text);
  // Ends the in-place line so that what follows starts on a fresh line.
  void finish();
  static std::string format_duration(double seconds);

 private:
  int64_t total_, every_;
  std::FILE* out_;
  bool tty_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace memfit
