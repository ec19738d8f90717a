// Tickets, chunks, errors and the choice of engine (io_engine.h).
#include "memfit/offload/io_engine.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "memfit/core/error.h"

namespace memfit::offload {

uint64_t IoEngine::submit(IoRequest r) {
  const uint64_t t = ++next_ticket_;
  Pending p;
  p.request = std::move(r);
  const IoRequest& q = p.request;
  InjectedFault fault;
  if (injected_fault(&fault)) {
    // Fails as the disk would have, without issuing anything.
    p.finished = true;
    if (fault.short_io) {
      p.short_expected = q.bytes;
      p.short_bytes = q.bytes / 2;
    } else {
      p.error = fault.error;
    }
    pending_.emplace_back(t, std::move(p));
    return t;
  }
  p.chunks_left = (q.bytes + kIoChunkBytes - 1) / kIoChunkBytes;
  p.finished = p.chunks_left == 0;
  pending_.emplace_back(t, p);
  for (size_t at = 0; at < q.bytes; at += kIoChunkBytes) {
    const size_t n = std::min(kIoChunkBytes, q.bytes - at);
    issue({t, q.op, q.fd, q.offset + at, static_cast<char*>(q.buffer) + at, n});
  }
  return t;
}

IoEngine::Pending* IoEngine::find(uint64_t ticket) {
  for (auto& [t, p] : pending_)
    if (t == ticket) return &p;
  return nullptr;
}

void IoEngine::done(uint64_t ticket, size_t expected, ssize_t result) {
  Pending* p = find(ticket);
  if (!p) return;
  if (result < 0) {
    if (!p->error) p->error = static_cast<int>(-result);
  } else if (static_cast<size_t>(result) != expected && !p->error && !p->short_expected) {
    p->short_bytes = static_cast<size_t>(result);
    p->short_expected = expected;
  }
  if (--p->chunks_left == 0) p->finished = true;
}

void IoEngine::raise(const Pending& p) const {
  const IoRequest& r = p.request;
  const char* op = r.op == IoRequest::Op::read ? "read" : "write";
  if (p.error)
    MEMFIT_THROW(IoError, "offload", "{} of {} bytes at offset {} of {} failed: {} (errno {})", op,
                 r.bytes, r.offset, r.file, std::strerror(p.error), p.error);
  MEMFIT_THROW(IoError, "offload",
               "short {} at offset {} of {}: {} of {} bytes (the file is shorter than its "
               "header says, or the disk is full)",
               op, r.offset, r.file, p.short_bytes, p.short_expected);
}

void IoEngine::wait(uint64_t ticket) {
  Pending* p = find(ticket);
  if (!p) return;  // waited for already
  while (!p->finished) {
    reap();
    p = find(ticket);
  }
  Pending done = std::move(*p);
  std::erase_if(pending_, [&](const auto& e) { return e.first == ticket; });
  if (done.error || done.short_expected) {
    // Nothing may still be writing into (or reading from) a caller's buffer once it unwinds.
    for (;;) {
      bool busy = false;
      for (auto& [t, q] : pending_) busy |= !q.finished;
      if (!busy) break;
      reap();
    }
    pending_.clear();
    raise(done);
  }
}

void IoEngine::wait_all() {
  while (!pending_.empty()) wait(pending_.front().first);
}

namespace {

InjectedFault parse_fault(std::string_view what) {
  if (what.empty() || what == "EIO") return {EIO, false};
  if (what == "ENOSPC") return {ENOSPC, false};
  if (what == "short") return {0, true};
  MEMFIT_THROW(ConfigError, "offload",
               "MEMFIT_OFFLOAD_FAIL_IO=N[:EIO|ENOSPC|short]: unknown failure '{}'", what);
}

}  // namespace

bool injected_fault(InjectedFault* fault) {
  static std::mutex mu;
  static uint64_t count = 0;
  static std::string counting;  // the setting being counted for: a new one starts again at 1
  const char* env = std::getenv("MEMFIT_OFFLOAD_FAIL_IO");
  if (!env || !*env) return false;
  const std::lock_guard lock(mu);
  const std::string_view spec(env);
  if (spec != counting) {
    counting = spec;
    count = 0;
  }
  const size_t colon = spec.find(':');
  const uint64_t n = std::strtoull(std::string(spec.substr(0, colon)).c_str(), nullptr, 10);
  if (++count != n) return false;
  *fault = parse_fault(colon == std::string_view::npos ? "" : spec.substr(colon + 1));
  return true;
}

IoChoice io_choice_from_env(const char* value) {
  const std::string_view asked = value ? value : "";
  if (asked == "threads") return IoChoice::threads;
  if (asked.empty() || asked == "uring") return IoChoice::uring;
  MEMFIT_THROW(ConfigError, "offload",
               "MEMFIT_OFFLOAD_IO must be uring (the default: io_uring, or the threads where it "
               "cannot start) or threads (pread/pwrite threads), got '{}'",
               asked);
}

std::unique_ptr<IoEngine> make_io_engine() {
  if (io_choice_from_env(std::getenv("MEMFIT_OFFLOAD_IO")) == IoChoice::threads)
    return make_thread_engine();
  std::string why;
  if (std::unique_ptr<IoEngine> e = make_uring_engine(&why)) return e;
  static std::once_flag said;
  std::call_once(said, [&] {
    fmt::print(stderr, "memfit: offload I/O uses pread/pwrite threads: {}\n", why);
  });
  return make_thread_engine();
}

}  // namespace memfit::offload
