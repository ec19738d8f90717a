#include "memfit/dist/mpi/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"
#include "memfit/memory/pool.h"

namespace memfit::dist::mpi {

namespace {

// A DistError quoting the call, unless rc is MPI_SUCCESS.
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  MEMFIT_THROW(DistError, "mpi", "{} failed: {} (error {})", call,
               len ? std::string(text, static_cast<size_t>(len)) : std::string("unknown"), rc);
}
#define MEMFIT_MPI(call) check(call, #call)

// MPI takes int counts: a collective above 2^31 - 1 elements is refused, not truncated (the
// callers' buckets are far smaller).
int as_count(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    MEMFIT_THROW(DistError, "mpi", "{} of {} elements is outside MPI's int counts", what, n);
  return static_cast<int>(n);
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// Waits for `r`; past `timeout` seconds (0: never) a DistError naming the collective. A loop of
// MPI_Test is what MPI_Wait does inside OpenMPI (each test runs the progress engine once, and
// yields the core when oversubscribed); the clock is read every 1024 tests. Note [Failures].
void wait_request(MPI_Request& r, const std::string& what, double timeout) {
  if (timeout <= 0) {
    check(MPI_Wait(&r, MPI_STATUS_IGNORE), what.c_str());
    return;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  for (uint64_t i = 0;; ++i) {
    int flag = 0;
    check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), what.c_str());
    if (flag) return;
    if ((i & 1023) == 1023 && std::chrono::steady_clock::now() > until)
      MEMFIT_THROW(DistError, "mpi",
                   "{} did not complete within {:g} s: another rank has stopped, hung or issued "
                   "a different collective (MEMFIT_CHECK_COLLECTIVES=1 reports which); "
                   "--collective-timeout sets this limit (0: wait forever)",
                   what, timeout);
  }
}

// Initialises MPI once per process and finalises it at exit, at thread level FUNNELED, or
// SERIALIZED where `serialized` (--tp-overlap's communication thread: comm_thread.h). MPI cannot
// be initialised twice: a later call that needs more than the level MPI gave is refused.
void ensure_initialized(bool serialized) {
  const int need = serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
  const char* name = serialized ? "SERIALIZED" : "FUNNELED";
  static const bool done = [&] {
    int initialized = 0;
    MEMFIT_MPI(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      MEMFIT_MPI(MPI_Init_thread(nullptr, nullptr, need, &provided));
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    return true;
  }();
  (void)done;
  int provided = 0;
  MEMFIT_MPI(MPI_Query_thread(&provided));
  if (provided < need)
    MEMFIT_THROW(DistError, "mpi",
                 "the MPI library gave thread level {} where {} ({}) is needed{}", provided, need,
                 name,
                 serialized ? ": --tp-overlap on runs the tensor group's collectives on a second "
                              "thread; use an MPI built with thread support, or --tp-overlap off"
                            : "");
}

// A reduce-scatter's receive buffer: from the pool (Category::comm) when there is one.
// The caller's buffer when it lends one; else one lent for the exchange's duration.
// Elements of T (float; uint16_t for bf16).
template <class T>
class Receive {
 public:
  Receive(MemoryPool* pool, size_t n, std::span<T> lent) : lent_(lent) {
    if (!lent.empty()) return;
    if (pool)
      alloc_ = pool->allocate(std::max<size_t>(n, 1) * sizeof(T), Category::comm, "comm.receive");
    else
      heap_.resize(n);
  }
  T* data() {
    if (!lent_.empty()) return lent_.data();
    return alloc_ ? static_cast<T*>(alloc_.data()) : heap_.data();
  }

 private:
  std::span<T> lent_;
  Allocation alloc_;
  std::vector<T> heap_;
};

// One MPI request; `after` runs once it completes (a reduce-scatter's sum). `what` names the
// collective in errors ("MPI_Ialltoallv (collective 12, reduce-scatter of 1024 floats)"), and a
// wait fails after `timeout` seconds (0: never).
class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request r, std::function<void()> after, std::string what, double timeout)
      : req_(r), after_(std::move(after)), what_(std::move(what)), timeout_(timeout) {}
  ~MpiRequest() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {  // a destructor must not throw; wait() is where a caller sees errors
      }
    }
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), what_.c_str());
    if (flag) finish();
    return flag != 0;
  }
  void wait() override {
    if (done_) return;
    wait_request(req_, what_, timeout_);
    finish();
  }

 private:
  void finish() {
    done_ = true;
    if (after_) after_();
  }
  MPI_Request req_;
  std::function<void()> after_;
  std::string what_;
  double timeout_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // Owns `comm` (a duplicate of MPI_COMM_WORLD, or a group split from one).
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MEMFIT_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MEMFIT_MPI(MPI_Comm_rank(comm_, &rank_));
    MEMFIT_MPI(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    if (auto nl = v.find_first_of(",\n"); nl != std::string::npos) v.resize(nl);
    return fmt::format("MPI ({}), {} ranks", v, size_);
  }

  // Each rank sends rank q its range q of `in` and receives every rank's range of its own
  // (MPI_Ialltoallv), then adds them in rank order: the transport only moves bytes, so the sum
  // does not depend on its algorithm.
  std::unique_ptr<Request> reduce_scatter_async(std::span<const float> in, std::span<float> out,
                                                std::span<const int64_t> counts,
                                                std::span<float> receive) override {
    const std::vector<int> c = checked_counts(counts, "reduce_scatter");
    const int mine = c[static_cast<size_t>(rank_)];
    const int64_t total = std::accumulate(c.begin(), c.end(), int64_t{0});
    if (static_cast<int64_t>(in.size()) != total || static_cast<int>(out.size()) != mine)
      MEMFIT_THROW(DistError, "reduce_scatter", "in {} floats (want {}), out {} (want {})",
                   in.size(), total, out.size(), mine);
    const size_t need = static_cast<size_t>(mine) * size_;
    if (!receive.empty() && receive.size() < need)
      MEMFIT_THROW(DistError, "reduce_scatter", "a receive buffer of {} floats, need {}",
                   receive.size(), need);
    auto staging = std::make_shared<Receive<float>>(pool_, receive.empty() ? need : 0, receive);
    const std::vector<int> sdispl = displacements(c);
    const std::vector<int> rcounts(static_cast<size_t>(size_), mine);
    const std::vector<int> rdispl = displacements(rcounts);
    MPI_Request r;
    MEMFIT_MPI(MPI_Ialltoallv(in.data(), c.data(), sdispl.data(), MPI_FLOAT, staging->data(),
                              rcounts.data(), rdispl.data(), MPI_FLOAT, comm_, &r));
    const int ranks = size_;
    auto sum = [staging, out, mine, ranks] {
      const float* s = staging->data();
      float* o = out.data();
      for (int i = 0; i < mine; ++i) o[i] = s[i];
      for (int q = 1; q < ranks; ++q) {
        const float* part = s + static_cast<size_t>(q) * mine;
        for (int i = 0; i < mine; ++i) o[i] += part[i];
      }
    };
    return std::make_unique<MpiRequest>(
        r, sum, name("MPI_Ialltoallv", fmt::format("reduce-scatter of {} floats", total)),
        timeout_s_);
  }

  // The same exchange of bf16 (MPI_UINT16_T: bytes moved, nothing added by MPI), each
  // element's pieces widened and added in rank order in f32, rounded to bf16 once.
  std::unique_ptr<Request> reduce_scatter_bf16_async(std::span<const uint16_t> in,
                                                     std::span<uint16_t> out,
                                                     std::span<const int64_t> counts,
                                                     std::span<uint16_t> receive) override {
    const std::vector<int> c = checked_counts(counts, "reduce_scatter");
    const int mine = c[static_cast<size_t>(rank_)];
    const int64_t total = std::accumulate(c.begin(), c.end(), int64_t{0});
    if (static_cast<int64_t>(in.size()) != total || static_cast<int>(out.size()) != mine)
      MEMFIT_THROW(DistError, "reduce_scatter", "in {} bf16 (want {}), out {} (want {})",
                   in.size(), total, out.size(), mine);
    const size_t need = static_cast<size_t>(mine) * size_;
    if (!receive.empty() && receive.size() < need)
      MEMFIT_THROW(DistError, "reduce_scatter", "a receive buffer of {} bf16, need {}",
                   receive.size(), need);
    auto staging = std::make_shared<Receive<uint16_t>>(pool_, receive.empty() ? need : 0, receive);
    const std::vector<int> sdispl = displacements(c);
    const std::vector<int> rcounts(static_cast<size_t>(size_), mine);
    const std::vector<int> rdispl = displacements(rcounts);
    MPI_Request r;
    MEMFIT_MPI(MPI_Ialltoallv(in.data(), c.data(), sdispl.data(), MPI_UINT16_T, staging->data(),
                              rcounts.data(), rdispl.data(), MPI_UINT16_T, comm_, &r));
    const int ranks = size_;
    auto sum = [staging, out, mine, ranks] {
      const uint16_t* s = staging->data();
      uint16_t* o = out.data();
#pragma omp parallel for schedule(static) if (mine > (1 << 16))
      for (int i = 0; i < mine; ++i) {
        float acc = f32_from_bf16(s[i]);
        for (int q = 1; q < ranks; ++q) acc += f32_from_bf16(s[static_cast<size_t>(q) * mine + i]);
        o[i] = bf16_from_f32(acc);
      }
    };
    return std::make_unique<MpiRequest>(
        r, sum, name("MPI_Ialltoallv", fmt::format("reduce-scatter of {} bf16", total)),
        timeout_s_);
  }

  std::unique_ptr<Request> all_gather_async(const void* in, void* out,
                                            std::span<const int64_t> counts,
                                            int elem_bytes) override {
    std::vector<int64_t> bytes(counts.begin(), counts.end());
    for (int64_t& b : bytes) b *= elem_bytes;
    const std::vector<int> c = checked_counts(bytes, "all_gather");
    const std::vector<int> displ = displacements(c);
    // In place when `in` is already this rank's range of `out`.
    const bool in_place =
        static_cast<const char*>(in) == static_cast<const char*>(out) + displ[static_cast<size_t>(rank_)];
    MPI_Request r;
    MEMFIT_MPI(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : in, c[static_cast<size_t>(rank_)],
                               MPI_BYTE, out, c.data(), displ.data(), MPI_BYTE, comm_, &r));
    return std::make_unique<MpiRequest>(
        r, nullptr,
        name("MPI_Iallgatherv", fmt::format("all-gather of {} bytes",
                                            std::accumulate(c.begin(), c.end(), int64_t{0}))),
        timeout_s_);
  }

  std::unique_ptr<Request> all_reduce_async(std::span<float> data,
                                            std::span<float> receive) override {
    auto counts = std::make_shared<std::vector<int64_t>>(
        even_counts(static_cast<int64_t>(data.size()), size_));
    int64_t offset = 0;
    for (int q = 0; q < rank_; ++q) offset += (*counts)[static_cast<size_t>(q)];
    std::span<float> mine = data.subspan(static_cast<size_t>(offset),
                                         static_cast<size_t>((*counts)[static_cast<size_t>(rank_)]));
    // The rank's sums land in its own range of `data` (written once the exchange is done), and
    // the gather fills the rest in place.
    std::unique_ptr<Request> scatter = reduce_scatter_async(data, mine, *counts, receive);
    return std::make_unique<ChainedRequest>(std::move(scatter), [this, data, mine, counts] {
      return all_gather_async(mine.data(), data.data(), *counts, sizeof(float));
    });
  }

  // Nonblocking underneath, so that the wait has the timeout too.
  void broadcast(void* data, int64_t bytes, int root) override {
    MPI_Request r;
    MEMFIT_MPI(MPI_Ibcast(data, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &r));
    wait_request(r, name("MPI_Ibcast", fmt::format("broadcast of {} bytes from rank {}", bytes, root)),
                 timeout_s_);
  }
  void barrier() override {
    MPI_Request r;
    MEMFIT_MPI(MPI_Ibarrier(comm_, &r));
    wait_request(r, name("MPI_Ibarrier", "barrier"), timeout_s_);
  }

  // MPI_Isend / MPI_Irecv of bytes; the wait has the timeout as the collectives' do.
  std::unique_ptr<Request> send_async(const void* data, int64_t bytes, int peer,
                                      int tag) override {
    check_peer(peer, "send");
    MPI_Request r;
    MEMFIT_MPI(MPI_Isend(data, as_count(bytes, "send"), MPI_BYTE, peer, tag, comm_, &r));
    return std::make_unique<MpiRequest>(
        r, nullptr,
        name("MPI_Isend", fmt::format("send of {} bytes to rank {}, tag {}", bytes, peer, tag)),
        timeout_s_);
  }
  std::unique_ptr<Request> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    check_peer(peer, "recv");
    MPI_Request r;
    MEMFIT_MPI(MPI_Irecv(data, as_count(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &r));
    return std::make_unique<MpiRequest>(
        r, nullptr,
        name("MPI_Irecv",
             fmt::format("receive of {} bytes from rank {}, tag {}", bytes, peer, tag)),
        timeout_s_);
  }

  // MPI_Comm_split blocks (MPI has no nonblocking split), so no timeout: it runs at set-up,
  // before any rank can have gone its own way.
  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) MEMFIT_THROW(DistError, "split", "color {} (colors are 0 or more)", color);
    MPI_Comm group = MPI_COMM_NULL;
    MEMFIT_MPI(MPI_Comm_split(comm_, color, key, &group));
    auto c = std::make_unique<MpiCommunicator>(group);
    c->set_timeout(timeout_s_);
    return c;
  }

 private:
  // A first request, then the one `next` starts. The second collective starts in wait(), never
  // in test(): ranks must start collectives in the same order, and whether a test() finds the
  // first one done differs between ranks, while the points where they wait do not.
  class ChainedRequest final : public Request {
   public:
    ChainedRequest(std::unique_ptr<Request> first, std::function<std::unique_ptr<Request>()> next)
        : first_(std::move(first)), next_(std::move(next)) {}
    bool test() override {
      if (!second_) {
        first_->test();  // progress only
        return false;
      }
      return second_->test();
    }
    void wait() override {
      if (!second_) {
        first_->wait();
        second_ = next_();
      }
      second_->wait();
    }

   private:
    std::unique_ptr<Request> first_, second_;
    std::function<std::unique_ptr<Request>()> next_;
  };

  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= size_)
      MEMFIT_THROW(DistError, op, "peer rank {} of {} ranks", peer, size_);
  }

  std::vector<int> checked_counts(std::span<const int64_t> counts, const char* op) const {
    if (static_cast<int>(counts.size()) != size_)
      MEMFIT_THROW(DistError, op, "{} counts for {} ranks", counts.size(), size_);
    std::vector<int> c;
    for (int64_t n : counts) c.push_back(as_count(n, op));
    return c;
  }

  // "MPI_Iallgatherv (collective 7 of rank 1: all-gather of 64 bytes)": the call as errors
  // name it, numbered in the order this rank started them.
  std::string name(const char* call, const std::string& what) {
    return fmt::format("{} (collective {} of rank {}: {})", call, ++started_, rank_, what);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int64_t started_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(bool serialized) {
  ensure_initialized(serialized);
  MPI_Comm world = MPI_COMM_NULL;
  MEMFIT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  return std::make_unique<MpiCommunicator>(world);
}

void abort_world(int code) {
  int initialized = 0, finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace memfit::dist::mpi
