// The communication thread of --tp-overlap (dist/comm_thread.h): a task runs on another thread
// while the caller goes on, wait() returns once it has finished (its writes visible) and
// rethrows what it threw, a second task before the wait is refused, and the thread's OpenMP
// regions run one thread. The collectives it runs in a step:
// tests/cli/tensor_parallel_overlap_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "memfit/core/error.h"
#include "memfit/dist/comm_thread.h"

namespace memfit::dist {
namespace {

TEST(CommThread, RunsTheTaskOnAnotherThreadWhileTheCallerGoesOn) {
  CommThread thread;
  std::atomic<bool> release{false};
  std::thread::id ran_on;
  std::vector<int> data(1000, 1);
  thread.run([&] {
    ran_on = std::this_thread::get_id();
    while (!release.load()) std::this_thread::yield();  // until the caller has gone on
    for (int& x : data) x *= 3;
  });
  EXPECT_TRUE(thread.busy());
  release = true;  // the caller went on while the task was waiting: it runs concurrently
  double waited = 0;
  thread.wait(&waited);
  EXPECT_FALSE(thread.busy());
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_GE(waited, 0.0);
  for (int x : data) ASSERT_EQ(x, 3);
  thread.wait();  // nothing in flight: at once
  int n = 0;
  for (int i = 0; i < 100; ++i) {  // many tasks, one at a time, in order
    thread.run([&n, i] { EXPECT_EQ(n++, i); });
    thread.wait();
  }
  EXPECT_EQ(n, 100);
}

TEST(CommThread, RethrowsTheTasksErrorAndRefusesASecondTask) {
  CommThread thread;
  thread.run([] { throw std::runtime_error("collective failed"); });
  EXPECT_THROW(
      {
        try {
          thread.wait();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "collective failed");
          throw;
        }
      },
      std::runtime_error);
  thread.wait();  // the error was reported once
  std::atomic<bool> release{false};
  thread.run([&] {
    while (!release.load()) std::this_thread::yield();
  });
  EXPECT_THROW(thread.run([] {}), Error);
  release = true;
  thread.wait();
}

TEST(CommThread, EndsAfterTheTaskInFlight) {
  std::atomic<int> done{0};
  {
    CommThread thread;
    thread.run([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = 1;
    });
  }
  EXPECT_EQ(done.load(), 1);
}

#ifdef _OPENMP
TEST(CommThread, ItsOpenMpRegionsRunOneThread) {
  CommThread thread;
  int team = 0;
  thread.run([&] {
#pragma omp parallel
    {
#pragma omp single
      team = omp_get_num_threads();
    }
  });
  thread.wait();
  EXPECT_EQ(team, 1);
}
#endif

}  // namespace
}  // namespace memfit::dist
