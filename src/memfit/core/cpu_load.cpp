// Other work's CPU use over an interval; see cpu_load.h.
#include "memfit/core/cpu_load.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace memfit::cpu {

namespace {

// Seconds all CPUs spent busy since boot: /proc/stat's first line, user + nice + system + irq +
// softirq + steal (guest time is inside user). -1 where the file cannot be read.
double machine_busy_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  long long user, nice, system, idle, iowait, irq, softirq, steal = 0;
  if (!(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq) || cpu != "cpu")
    return -1;
  in >> steal;  // absent on old kernels
  const long ticks = ::sysconf(_SC_CLK_TCK);
  return double(user + nice + system + irq + softirq + steal) / double(ticks > 0 ? ticks : 100);
}

double self_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

}  // namespace

OtherLoad::OtherLoad()
    : machine_busy_s_(machine_busy_seconds()),
      self_s_(self_cpu_seconds()),
      start_(std::chrono::steady_clock::now()) {}

double OtherLoad::cpus() const {
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double busy = machine_busy_seconds();
  if (machine_busy_s_ < 0 || busy < 0 || wall <= 0) return 0;
  // /proc/stat counts in clock ticks, rusage in microseconds: a few ticks of disagreement on a
  // quiet machine, hence the clamp.
  const double others = (busy - machine_busy_s_) - (self_cpu_seconds() - self_s_);
  return std::max(0.0, others / wall);
}

int online_cpus() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

bool load_disturbs(double other_cpus, int threads) {
  const double idle = std::max(0, online_cpus() - threads);
  return other_cpus > idle + 0.1 * std::max(1, threads);
}

}  // namespace memfit::cpu
