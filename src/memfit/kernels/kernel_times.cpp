#include "memfit/kernels/kernel_times.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

namespace memfit::kernels {

namespace {

std::atomic<bool> g_on{false};
std::mutex g_mutex;
std::map<std::string, KernelTime, std::less<>>& totals() {
  static std::map<std::string, KernelTime, std::less<>> t;
  return t;
}
thread_local KernelScope* t_open = nullptr;  // this thread's innermost open scope

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void record_kernel_times(bool on) { g_on.store(on, std::memory_order_relaxed); }
bool kernel_times_on() { return g_on.load(std::memory_order_relaxed); }

void reset_kernel_times() {
  std::lock_guard<std::mutex> lock(g_mutex);
  totals().clear();
}

std::vector<KernelTime> kernel_times() {
  std::vector<KernelTime> out;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [name, t] : totals()) out.push_back(t);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelTime& a, const KernelTime& b) { return a.seconds > b.seconds; });
  return out;
}

KernelScope::KernelScope(const char* name, double flops) : name_(name), flops_(flops) {
  if (kernel_times_on()) open();
}

KernelScope::KernelScope(std::string name, double flops) : owned_(std::move(name)), flops_(flops) {
  if (kernel_times_on()) open();
}

void KernelScope::open() {
  // Inside a parallel region the enclosing kernel's scope (on the thread that opened the
  // region) already counts this time, and other threads would add theirs on top.
  if (omp_in_parallel()) return;
  active_ = true;
  parent_ = t_open;
  t_open = this;
  start_ns_ = now_ns();
}

KernelScope::~KernelScope() {
  if (!active_) return;
  const int64_t elapsed = now_ns() - start_ns_;
  t_open = parent_;
  if (parent_) parent_->children_ns_ += elapsed;
  const std::string_view name = name_ ? std::string_view(name_) : std::string_view(owned_);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = totals().find(name);
  if (it == totals().end()) it = totals().emplace(std::string(name), KernelTime{std::string(name)}).first;
  KernelTime& t = it->second;
  t.calls += 1;
  t.seconds += static_cast<double>(elapsed - children_ns_) * 1e-9;
  t.flops += flops_;
}

}  // namespace memfit::kernels
