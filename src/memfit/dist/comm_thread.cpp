// The communication thread of --tp-overlap; see comm_thread.h.
#include "memfit/dist/comm_thread.h"

#include <chrono>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "memfit/core/error.h"

namespace memfit::dist {

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return !pending_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommThread::run(std::function<void()> task) {
  {
    const std::lock_guard lock(mutex_);
    MEMFIT_CHECK(!pending_, "comm_thread", "a second task handed to the communication thread "
                 "before the first was waited for");
    task_ = std::move(task);
    error_ = nullptr;
    pending_ = true;
  }
  cv_.notify_all();
}

void CommThread::wait(double* waited) {
  const auto t0 = std::chrono::steady_clock::now();
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return !pending_; });
    error = std::exchange(error_, nullptr);
  }
  if (waited)
    *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error) std::rethrow_exception(error);
}

bool CommThread::busy() const {
  const std::lock_guard lock(mutex_);
  return pending_;
}

void CommThread::loop() {
#ifdef _OPENMP
  omp_set_num_threads(1);  // this thread's regions: one thread (comm_thread.h)
#endif
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return pending_ || stop_; });
    if (stop_ && !pending_) return;
    std::function<void()> task = std::move(task_);
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace memfit::dist
