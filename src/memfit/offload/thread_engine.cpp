// The fallback engine: pread/pwrite on a few threads, for kernels or containers without
// io_uring. Chunks are queued; each thread takes the next and reports its completion.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "memfit/offload/io_engine.h"

namespace memfit::offload {

namespace {

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadEngine() override {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    todo_cv_.notify_all();
    for (std::thread& t : workers_) t.join();  // they finish what is queued first
  }
  std::string name() const override { return "threads"; }

 protected:
  void issue(const Chunk& c) override {
    {
      const std::lock_guard lock(mu_);
      todo_.push_back(c);
    }
    todo_cv_.notify_one();
  }

  void reap() override {
    std::deque<Finished> got;
    {
      std::unique_lock lock(mu_);
      done_cv_.wait(lock, [&] { return !finished_.empty(); });
      got.swap(finished_);
    }
    for (const Finished& f : got) done(f.ticket, f.bytes, f.result);
  }

 private:
  struct Finished {
    uint64_t ticket;
    size_t bytes;
    ssize_t result;
  };

  // The whole chunk, or the first error; a 0-byte transfer (end of file) ends it short.
  static ssize_t transfer(const Chunk& c) {
    size_t at = 0;
    while (at < c.bytes) {
      char* p = static_cast<char*>(c.buffer) + at;
      const off_t off = static_cast<off_t>(c.offset + at);
      const ssize_t n = c.op == IoRequest::Op::read ? ::pread(c.fd, p, c.bytes - at, off)
                                                    : ::pwrite(c.fd, p, c.bytes - at, off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return -errno;
      if (n == 0) break;
      at += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(at);
  }

  void work() {
    for (;;) {
      Chunk c;
      {
        std::unique_lock lock(mu_);
        todo_cv_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (todo_.empty()) return;
        c = todo_.front();
        todo_.pop_front();
      }
      const ssize_t r = transfer(c);
      {
        const std::lock_guard lock(mu_);
        finished_.push_back({c.ticket, c.bytes, r});
      }
      done_cv_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable todo_cv_, done_cv_;
  std::deque<Chunk> todo_;
  std::deque<Finished> finished_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> make_thread_engine(int threads) {
  return std::make_unique<ThreadEngine>(threads);
}

}  // namespace memfit::offload
