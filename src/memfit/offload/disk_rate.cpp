// The offload directory's disk rates (disk_rate.h).
#include "memfit/offload/disk_rate.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "memfit/core/cache_dir.h"
#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/created_directories.h"
#include "memfit/offload/io_engine.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/offload/scratch_file.h"

namespace memfit::offload {

namespace fs = std::filesystem;

DiskRate measure_disk_rate(const fs::path& dir, uint64_t bytes) {
  bytes = std::max<uint64_t>(align_up(bytes), kIoAlign);
  // The test file goes in `dir`'s nearest existing ancestor, on the same filesystem, so the
  // test makes no directory: ranks measuring at once while another rank's trainer makes its
  // files' directories in `dir` would otherwise race to remove what each made (a directory
  // left behind; LoraZero3.TheBaseOnDiskTrainsAsInRamAndAsPlanned caught it). The pid keeps
  // the ranks' test files apart.
  ScratchFile file(io::existing_ancestor(dir) /
                       fmt::format("memfit-disk-test-{}.offload", ::getpid()),
                   kHeaderBytes + bytes, {{"memfit_offload", 1}, {"run", "disk rate test"}});
  std::unique_ptr<IoEngine> io = make_io_engine();
  // The buffer is the test's own, outside any pool: nothing is planned around a measurement.
  void* buffer = std::aligned_alloc(kIoAlign, bytes);
  std::memset(buffer, 0x5a, bytes);
  auto timed = [&](IoRequest::Op op) {
    const auto t0 = std::chrono::steady_clock::now();
    io->wait(io->submit({op, file.fd(), kHeaderBytes, buffer, bytes, file.path().string()}));
    if (op == IoRequest::Op::write) ::fdatasync(file.fd());  // count what reached the disk
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  DiskRate r;
  r.bytes = bytes;
  try {
    r.write_bytes_per_s = bytes / timed(IoRequest::Op::write);
    r.read_bytes_per_s = bytes / timed(IoRequest::Op::read);
  } catch (...) {
    std::free(buffer);
    throw;
  }
  std::free(buffer);
  return r;
}

namespace {

dev_t device_of(const fs::path& dir) {
  struct stat st;
  if (::stat(io::existing_ancestor(dir).c_str(), &st) != 0)
    MEMFIT_THROW(IoError, "offload", "--offload-dir {}: {}", dir.string(), std::strerror(errno));
  return st.st_dev;
}

}  // namespace

fs::path disk_rate_cache_path(const fs::path& dir) {
  return calibration_cache_dir() /
         fmt::format("disk-{}.json", static_cast<uint64_t>(device_of(dir)));
}

const DiskRate& disk_rate(const fs::path& dir, bool remeasure) {
  static std::mutex mu;
  static std::map<dev_t, DiskRate> known;
  const dev_t dev = device_of(dir);
  const std::lock_guard lock(mu);
  if (auto it = known.find(dev); it != known.end() && !remeasure) return it->second;
  const fs::path cache = disk_rate_cache_path(dir);
  if (!remeasure) {
    try {
      const auto j = nlohmann::json::parse(io::read_file_to_string(cache));
      DiskRate r{j.at("read_bytes_per_s").get<double>(), j.at("write_bytes_per_s").get<double>(),
                 j.at("bytes").get<uint64_t>()};
      if (r.read_bytes_per_s > 0 && r.write_bytes_per_s > 0) return known[dev] = r;
    } catch (const std::exception&) {
      // Missing or unreadable: measured again below.
    }
  }
  const DiskRate r = measure_disk_rate(dir);
  fmt::print(stderr,
             "memfit: measured the disk of {} for offload: write {:.2f} GB/s, read {:.2f} GB/s "
             "(cached in {})\n",
             dir.string(), r.write_bytes_per_s / 1e9, r.read_bytes_per_s / 1e9, cache.string());
  try {
    fs::create_directories(cache.parent_path());
    io::write_file_atomic(cache, nlohmann::json({{"dir", dir.string()},
                                                 {"read_bytes_per_s", r.read_bytes_per_s},
                                                 {"write_bytes_per_s", r.write_bytes_per_s},
                                                 {"bytes", r.bytes}})
                                     .dump(1));
  } catch (const std::exception&) {
    // A read-only cache still plans, measuring again next time.
  }
  return known[dev] = r;
}

}  // namespace memfit::offload
