// What one OpenMP parallel region costs when the team has been idle for a while: the calling
// thread computes alone for `gap_us` microseconds (as a step does between two kernels: a
// serial reduction, the trainer's bookkeeping), then opens a region in which every thread does
// nothing but check in. The time is that of the region alone. libgomp's idle threads spin for
// GOMP_SPINCOUNT pauses and then sleep on a futex, so past some gap the region pays for waking
// them; how large that cost is depends on the machine and on what it runs under (a gVisor
// guest makes futex calls expensive). Run it under OMP_WAIT_POLICY=active or GOMP_SPINCOUNT
// to see the cost go (docs/benchmarks.md, "What one parallel region costs").
#include <benchmark/benchmark.h>
#include <omp.h>

#include <atomic>
#include <chrono>

namespace memfit::kernels {
namespace {

void busy_for(std::chrono::microseconds gap) {
  const auto until = std::chrono::steady_clock::now() + gap;
  while (std::chrono::steady_clock::now() < until) {
  }
}

void BM_ParallelRegion_AfterGap(benchmark::State& state) {
  const std::chrono::microseconds gap(state.range(0));
  std::atomic<int> arrived{0};
  for (auto _ : state) {
    busy_for(gap);
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    arrived.fetch_add(1, std::memory_order_relaxed);
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  // Every thread of every region checked in: the regions ran on the whole team.
  if (arrived.load() != static_cast<int>(state.iterations()) * omp_get_max_threads())
    state.SkipWithError("a region ran on fewer threads than the team has");
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_ParallelRegion_AfterGap)
    ->ArgName("gap_us")
    ->Arg(0)
    ->Arg(100)
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(100000)
    // A fixed count: the gaps are not timed, so a time target would wait minutes at 100 ms.
    ->Iterations(30)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace memfit::kernels
