#include "memfit/train/progress.h"

#include <unistd.h>

#include <fmt/format.h>

namespace memfit {

Progress::Progress(int64_t total, std::FILE* out, int64_t every)
    : total_(total), every_(every < 1 ? 1 : every), out_(out),
      tty_(isatty(fileno(out)) != 0), start_(std::chrono::steady_clock::now()) {}

std::string Progress::format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{:02}:{:02}", t / 60, t % 60);
}

void Progress::update(int64_t done, const std::string& text) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = done > 0 ? elapsed / done * (total_ - done) : -1;
  std::string line = fmt::format("[{}/{}] {} | elapsed {} eta {}", done, total_, text,
                                 format_duration(elapsed), format_duration(eta));
  if (tty_) {
    fmt::print(out_, "\r\033[K{}", line);
    open_line_ = true;
  } else if (done % every_ == 0 || done == total_ || done == 1) {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void Progress::finish() {
  if (open_line_) fmt::print(out_, "\n");
  open_line_ = false;
  std::fflush(out_);
}

}  // namespace memfit
