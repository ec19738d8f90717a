// Asynchronous file I/O for offload: requests are queued and waited for by ticket, so the next
// unit's read and the last unit's write are in flight while the CPU updates this one. Two
// engines: io_uring (uring_engine.cpp, when liburing is there and the kernel allows it) and a
// pool of threads doing pread/pwrite (thread_engine.cpp). make_io_engine picks one and says
// once when it falls back. See Note [NVMe offload] (docs/notes/offload.md).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memfit::offload {

// Requests are split into chunks of this many bytes, several in flight at once (DeepSpeed's
// swapper uses 1 MiB blocks at queue depth 8; a few MiB keeps the queue short for 400 MB units).
inline constexpr size_t kIoChunkBytes = size_t{4} << 20;

struct IoRequest {
  enum class Op { read, write };
  Op op = Op::read;
  int fd = -1;
  uint64_t offset = 0;  // in the file
  void* buffer = nullptr;
  size_t bytes = 0;
  std::string file;     // for error messages
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // "io_uring" or "threads".
  virtual std::string name() const = 0;
  // Queues `r` (its buffer stays the caller's until wait returns) and returns its ticket.
  uint64_t submit(IoRequest r);
  // Blocks until request `ticket` is complete. Throws IoError naming the operation, the file,
  // the offset and errno (or the byte count of a short read or write) if it failed; the other
  // requests in flight are still waited for first, so no buffer is written behind the caller.
  void wait(uint64_t ticket);
  void wait_all();
  // Requests submitted so far (the fault-injection hook counts them).
  uint64_t submitted() const { return next_ticket_; }

 protected:
  IoEngine() = default;
  // A chunk of ticket `t`: [offset, offset + bytes) of r.fd from/to buffer.
  struct Chunk {
    uint64_t ticket;
    IoRequest::Op op;
    int fd;
    uint64_t offset;
    void* buffer;
    size_t bytes;
  };
  // Starts a chunk; may block until the engine has room.
  virtual void issue(const Chunk& c) = 0;
  // Waits for at least one chunk to complete and reports each completed one with done().
  virtual void reap() = 0;
  // A chunk of `ticket` finished: `result` is the byte count, or -errno.
  void done(uint64_t ticket, size_t expected, ssize_t result);

 private:
  struct Pending {
    IoRequest request;
    size_t chunks_left = 0;
    int error = 0;           // the first errno, or 0
    size_t short_bytes = 0;  // bytes actually moved by a short chunk
    size_t short_expected = 0;
    bool finished = false;
  };
  Pending* find(uint64_t ticket);
  void raise(const Pending& p) const;

  std::vector<std::pair<uint64_t, Pending>> pending_;  // few in flight: a vector is enough
  uint64_t next_ticket_ = 0;
};

// The io_uring engine, or null where it cannot start (no liburing at build time, a kernel or
// seccomp policy that refuses io_uring_setup); `why` then says why.
std::unique_ptr<IoEngine> make_uring_engine(std::string* why);
// pread/pwrite on `threads` threads.
std::unique_ptr<IoEngine> make_thread_engine(int threads = 4);

// MEMFIT_OFFLOAD_IO's value: "threads" forces the pread/pwrite threads (the tests run both);
// unset, empty or "uring" is the default, io_uring where it starts; any other value is a
// ConfigError that names the variable and what it takes.
enum class IoChoice : uint8_t { uring, threads };
IoChoice io_choice_from_env(const char* value);

// io_uring where it works, else the threads, saying so once on stderr; as MEMFIT_OFFLOAD_IO
// asks (io_choice_from_env).
std::unique_ptr<IoEngine> make_io_engine();

// Fault injection for tests: MEMFIT_OFFLOAD_FAIL_IO=N[:what] makes the Nth request submitted
// in this process (1-based, every engine counted together) fail without touching the file,
// as if it had returned `what`: EIO (the default), ENOSPC, or "short" (half the bytes).
struct InjectedFault {
  int error = 0;       // errno to report, 0 for a short transfer
  bool short_io = false;
};
// Whether the request being submitted now is the one to fail (counts every call).
bool injected_fault(InjectedFault* fault);

}  // namespace memfit::offload
