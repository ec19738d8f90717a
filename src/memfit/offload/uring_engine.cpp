// The io_uring engine: chunks become SQEs (read/write at an offset), completions are reaped in
// whatever order the disk finishes them. Built only with liburing (MEMFIT_HAVE_URING, set by
// CMake where pkg-config finds it); without it make_uring_engine says so and returns null.
#include "memfit/offload/io_engine.h"

#ifdef MEMFIT_HAVE_URING
#include <liburing.h>

#include <cstring>

#include <fmt/format.h>
#endif

namespace memfit::offload {

#ifdef MEMFIT_HAVE_URING
namespace {

// Deep enough for a unit's chunks of every file at once (a 7B block's master and two moments
// are about 200 chunks of 4 MiB each); more waits for the ring to drain.
constexpr unsigned kQueueDepth = 256;

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(io_uring ring) : ring_(ring) {}
  ~UringEngine() override {
    // Every chunk in flight points into a caller's buffer: finish them before letting go.
    while (in_flight_ > 0) reap();
    io_uring_queue_exit(&ring_);
  }
  std::string name() const override { return "io_uring"; }

 protected:
  void issue(const Chunk& c) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {  // the submission queue is full: let the kernel take it, free some entries
      io_uring_submit(&ring_);
      reap();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (c.op == IoRequest::Op::read)
      io_uring_prep_read(sqe, c.fd, c.buffer, static_cast<unsigned>(c.bytes), c.offset);
    else
      io_uring_prep_write(sqe, c.fd, c.buffer, static_cast<unsigned>(c.bytes), c.offset);
    // The ticket and the expected size travel with the request: one slot per chunk in flight.
    slots_.push_back({c.ticket, c.bytes});
    io_uring_sqe_set_data64(sqe, slots_.size() - 1 + base_);
    ++in_flight_;
    io_uring_submit(&ring_);
  }

  void reap() override {
    if (in_flight_ == 0) return;
    io_uring_cqe* cqe = nullptr;
    int rc;
    do rc = io_uring_wait_cqe(&ring_, &cqe);
    while (rc == -EINTR);
    if (rc < 0) return;  // nothing to reap now; the caller loops
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      const uint64_t id = io_uring_cqe_get_data64(cqe);
      const Slot s = slots_[id - base_];
      --in_flight_;
      done(s.ticket, s.bytes, cqe->res);
      ++n;
    }
    io_uring_cq_advance(&ring_, n);
    if (in_flight_ == 0) {  // nothing refers to the slots any more: start them again
      base_ += slots_.size();
      slots_.clear();
    }
  }

 private:
  struct Slot {
    uint64_t ticket;
    size_t bytes;
  };
  io_uring ring_;
  std::vector<Slot> slots_;
  uint64_t base_ = 0;
  size_t in_flight_ = 0;
};

}  // namespace

std::unique_ptr<IoEngine> make_uring_engine(std::string* why) {
  io_uring ring;
  const int rc = io_uring_queue_init(kQueueDepth, &ring, 0);
  if (rc < 0) {
    if (why) *why = fmt::format("io_uring_queue_init failed: {}", std::strerror(-rc));
    return nullptr;
  }
  return std::make_unique<UringEngine>(ring);
}
#else
std::unique_ptr<IoEngine> make_uring_engine(std::string* why) {
  if (why) *why = "memfit was built without liburing (install liburing-dev and rebuild)";
  return nullptr;
}
#endif

}  // namespace memfit::offload
