// The collectives data parallelism and ZeRO need, behind one narrow interface (as MLX's
// distributed group, or ggml's backends): a single-process implementation (this file's
// make_single_communicator) and an MPI one (dist/mpi/), so NCCL can slot in later.
//
// Sums are deterministic: every implementation adds the ranks' contributions element by element
// in rank order, ((x0 + x1) + x2) + ..., whatever the transport's own algorithm, so data
// parallelism and every ZeRO stage at the same world size give the same bits (Note [Deterministic
// reduction] in docs/notes/zero.md). Collectives take `counts`, the elements each rank owns (a
// ZeRO shard, a reduce-scatter's output); they may differ between ranks, and every rank passes
// the same counts. Every rank must issue the same collectives in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memfit/core/error.h"

namespace memfit {
class MemoryPool;
}

namespace memfit::dist {

// A failure every rank raises at the same point, having found it together (ranks that disagree
// about the run, dist/agreement.h; collective sequences that diverge, dist/checked_communicator.h):
// every rank can end normally. Any other error on one rank must end them all (abort_world).
class DisagreementError : public DistError {
  using DistError::DistError;
};

// An operation in flight. wait() finishes it (the reduction's sum included); test() makes
// progress and says whether it is done. A collective in two phases (all-reduce: reduce-scatter,
// then all-gather) starts its second in wait() only, so its test() stays false until then:
// every rank must start collectives in the same order, and only the points where ranks wait are
// the same on every rank. Destroying a pending request waits for it.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single process" or "MPI (OpenMPI 4.1.4), 2 ranks": what the run prints once.
  virtual std::string describe() const = 0;

  // out (counts[rank()] floats) = the sum over ranks of their `in` range of rank() (in holds
  // sum(counts) floats, rank r's range after ranks 0..r-1's). `out` may be this rank's range of
  // `in`: the sum is written once the exchange is done.
  // `receive`, if given, is where the W pieces arrive (at least receive_floats(counts) floats,
  // the caller's to keep alive until wait()); else the pool (set_pool) or the heap lends it.
  virtual std::unique_ptr<Request> reduce_scatter_async(std::span<const float> in,
                                                        std::span<float> out,
                                                        std::span<const int64_t> counts,
                                                        std::span<float> receive = {}) = 0;
  // out (sum(counts) elements of elem_bytes each) = every rank's `in` (counts[r]
  // elements) in rank order. Any element type: nothing is added.
  virtual std::unique_ptr<Request> all_gather_async(const void* in, void* out,
                                                    std::span<const int64_t> counts,
                                                    int elem_bytes) = 0;
  // The same on bf16 values (--grad-dtype bf16, raw bits): `in` and `out` bf16, the exchange
  // moves half the bytes; each element's W pieces are widened to f32, added in rank order in
  // f32 and rounded to bf16 (nearest even) once: ((x_0 + x_1) + x_2) + ... as the f32 sum adds
  // them, one rounding at the end. `receive` (bf16 elements), if given, as above.
  virtual std::unique_ptr<Request> reduce_scatter_bf16_async(std::span<const uint16_t> in,
                                                             std::span<uint16_t> out,
                                                             std::span<const int64_t> counts,
                                                             std::span<uint16_t> receive = {}) = 0;
  // data (n floats) = the sum over ranks, on every rank: reduce_scatter then all_gather over
  // an even split, so its sums are the reduce-scatter's, bit for bit.
  virtual std::unique_ptr<Request> all_reduce_async(std::span<float> data,
                                                    std::span<float> receive = {}) = 0;
  // The receive buffer a reduce-scatter with these counts needs on this rank: W pieces of its
  // range (0 for one process, which copies); an all-reduce of n floats needs
  // receive_floats(even_counts(n, size())).
  int64_t receive_floats(std::span<const int64_t> counts) const {
    return size() == 1 ? 0 : int64_t{size()} * counts[static_cast<size_t>(rank())];
  }
  // data (bytes) = root's, on every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Point to point, for pipeline stages (Note [Pipeline parallel]): activations go to the next
  // stage and their gradients back. send_async: `bytes` of `data` to rank `peer` with `tag`; the
  // caller keeps `data` alive and unchanged until wait(). recv_async: exactly `bytes` from `peer`
  // with `tag` into `data`, readable after wait(). Messages from one rank to another with one tag
  // arrive in the order they were sent (MPI's non-overtaking rule). These are not collectives:
  // only the two ranks take part, MEMFIT_CHECK_COLLECTIVES does not agree on them, and a rank
  // may send to itself (one process: the message is copied at send and handed to the first
  // matching receive; a receive with nothing sent is a DistError, as the wait would be forever).
  virtual std::unique_ptr<Request> send_async(const void* data, int64_t bytes, int peer,
                                              int tag) = 0;
  virtual std::unique_ptr<Request> recv_async(void* data, int64_t bytes, int peer, int tag) = 0;

  // The blocking forms.
  void reduce_scatter(std::span<const float> in, std::span<float> out,
                      std::span<const int64_t> counts) {
    reduce_scatter_async(in, out, counts)->wait();
  }
  void all_gather(const void* in, void* out, std::span<const int64_t> counts, int elem_bytes) {
    all_gather_async(in, out, counts, elem_bytes)->wait();
  }
  void all_reduce(std::span<float> data, std::span<float> receive = {}) {
    all_reduce_async(data, receive)->wait();
  }
  void send(const void* data, int64_t bytes, int peer, int tag) {
    send_async(data, bytes, peer, tag)->wait();
  }
  void recv(void* data, int64_t bytes, int peer, int tag) {
    recv_async(data, bytes, peer, tag)->wait();
  }

  // Where the collectives' own buffers come from (Category::comm, tag "comm.receive"): a
  // reduce-scatter receives W pieces of the rank's range before it adds them. Without a pool
  // (tests of the transport alone) they come from the heap.
  virtual void set_pool(MemoryPool* pool) { pool_ = pool; }

  // The longest a wait for one collective may take (seconds; 0: forever) before it fails with a
  // DistError naming the collective: another rank has stopped, hung or issued other
  // collectives. Note [Failures] in docs/notes/zero.md.
  virtual void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  // The ranks that pass the same `color` (>= 0), as a communicator of their own, numbered by
  // `key` (ties by rank in this one), as MPI_Comm_split does. Collective: every rank of this
  // communicator calls it at the same point of its sequence. The group keeps this one's timeout
  // and has no pool. Process groups (dist/process_grid.h) are made this way.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // After the run's last collective. With MEMFIT_CHECK_COLLECTIVES=1 the ranks agree here that
  // none issues more (dist/checked_communicator.h); otherwise nothing.
  virtual void end() {}

 protected:
  MemoryPool* pool_ = nullptr;
  double timeout_s_ = 0;
};

// One process: size 1, every collective a copy.
std::unique_ptr<Communicator> make_single_communicator();

// The world this process runs in: MPI's when it was started by a launcher (mpirun, srun: their
// environment says so) and memfit was built with MPI, else the single process. DistError when a
// launcher started it but the build has no MPI. `threads`: a second thread will call MPI too
// (--tp-overlap's communication thread), never at the same time: MPI at thread level
// SERIALIZED, a DistError where the library does not give it.
std::unique_ptr<Communicator> make_world_communicator(bool threads = false);

// Ends every process of the job at once after an error on this one (MPI_Abort with `code`):
// without it, the other ranks would wait forever in their next collective and this one in
// MPI_Finalize. Returns (doing nothing) where MPI was never started or is already finalised.
// The CLI's main() calls it; library code throws.
void abort_world(int code);

// This process's rank as its launcher says (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK), before
// any communicator exists; 0 when not launched as ranks.
int launched_rank();

// Whether this memfit was built with MPI (else it runs as one process only).
bool built_with_mpi();

// Whether a launcher (OpenMPI's mpirun, Slurm's srun, any PMIx launcher) started this process
// as one of several ranks.
bool launched_as_ranks();

// An even split of n elements over `ranks`: the first n % ranks get one more.
std::vector<int64_t> even_counts(int64_t n, int ranks);

}  // namespace memfit::dist
