// One thread that runs a rank's collectives while the thread that runs the step computes
// (--tp-overlap: Note [Tensor parallel], "Overlap"). OpenMPI moves a collective only inside MPI
// calls, so a nonblocking collective started before a oneDNN GEMM would sit until the GEMM ends;
// here the blocking collective runs on this thread instead, MPI initialised SERIALIZED (one
// thread in MPI at a time: the caller issues no MPI call of its own between run() and wait()).
// Started once, with the run's tensor group; each run() hands it one task, wait() joins it and
// rethrows what the task threw. The thread's OpenMP regions (the communicator's sums) run on one
// thread, so that it takes at most one core from the GEMM's team.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace memfit::dist {

class CommThread {
 public:
  CommThread();
  ~CommThread();  // waits for a task in flight, then ends the thread
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Hands `task` to the thread and returns at once. One task at a time: a second run() before
  // wait() is a logic error (memfit::Error).
  void run(std::function<void()> task);
  // Until the task has finished (at once when none is in flight); rethrows its exception.
  // `waited` gets the seconds spent here.
  void wait(double* waited = nullptr);
  bool busy() const;

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  std::exception_ptr error_;
  bool pending_ = false, stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace memfit::dist
