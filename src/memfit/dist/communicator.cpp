#include "memfit/dist/communicator.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/dist/checked_communicator.h"

#ifdef MEMFIT_HAVE_MPI
#include "memfit/dist/mpi/mpi_communicator.h"
#endif

namespace memfit::dist {

namespace {

class DoneRequest final : public Request {
 public:
  bool test() override { return true; }
  void wait() override {}
};

void check_counts(std::span<const int64_t> counts, int size, const char* op) {
  if (static_cast<int>(counts.size()) != size)
    MEMFIT_THROW(DistError, op, "{} counts for {} ranks", counts.size(), size);
  for (int64_t c : counts)
    if (c < 0) MEMFIT_THROW(DistError, op, "negative count {}", c);
}

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "single process"; }

  std::unique_ptr<Request> reduce_scatter_async(std::span<const float> in, std::span<float> out,
                                                std::span<const int64_t> counts,
                                                std::span<float>) override {
    check_counts(counts, 1, "reduce_scatter");
    if (in.size() != static_cast<size_t>(counts[0]) || out.size() != in.size())
      MEMFIT_THROW(DistError, "reduce_scatter", "in {} and out {} floats for a count of {}",
                   in.size(), out.size(), counts[0]);
    if (out.data() != in.data()) std::memmove(out.data(), in.data(), in.size_bytes());
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> reduce_scatter_bf16_async(std::span<const uint16_t> in,
                                                     std::span<uint16_t> out,
                                                     std::span<const int64_t> counts,
                                                     std::span<uint16_t>) override {
    // One rank's sum is its value: widened and rounded back, the same bits.
    check_counts(counts, 1, "reduce_scatter");
    if (in.size() != static_cast<size_t>(counts[0]) || out.size() != in.size())
      MEMFIT_THROW(DistError, "reduce_scatter", "in {} and out {} bf16 for a count of {}",
                   in.size(), out.size(), counts[0]);
    if (out.data() != in.data()) std::memmove(out.data(), in.data(), in.size_bytes());
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> all_gather_async(const void* in, void* out,
                                            std::span<const int64_t> counts,
                                            int elem_bytes) override {
    check_counts(counts, 1, "all_gather");
    if (out != in) std::memmove(out, in, static_cast<size_t>(counts[0]) * elem_bytes);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> all_reduce_async(std::span<float>, std::span<float>) override {
    return std::make_unique<DoneRequest>();
  }
  void broadcast(void*, int64_t, int root) override {
    if (root != 0) MEMFIT_THROW(DistError, "broadcast", "root {} of 1 rank", root);
  }
  void barrier() override {}
  // To itself only: a send is copied into a queue per tag, a receive takes the oldest.
  std::unique_ptr<Request> send_async(const void* data, int64_t bytes, int peer,
                                      int tag) override {
    check_peer(peer, bytes, "send");
    const auto* b = static_cast<const std::byte*>(data);
    sent_[tag].emplace_back(b, b + bytes);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    check_peer(peer, bytes, "recv");
    auto it = sent_.find(tag);
    if (it == sent_.end() || it->second.empty())
      MEMFIT_THROW(DistError, "recv",
                   "no message with tag {} was sent: one process would wait forever", tag);
    std::vector<std::byte>& m = it->second.front();
    if (static_cast<int64_t>(m.size()) != bytes)
      MEMFIT_THROW(DistError, "recv", "a receive of {} bytes for a message of {} (tag {})",
                   bytes, m.size(), tag);
    if (bytes > 0) std::memcpy(data, m.data(), m.size());
    it->second.pop_front();
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Communicator> split(int color, int) override {
    if (color < 0) MEMFIT_THROW(DistError, "split", "color {} (colors are 0 or more)", color);
    auto group = std::make_unique<SingleCommunicator>();
    group->set_timeout(timeout_s_);
    return group;
  }

 private:
  static void check_peer(int peer, int64_t bytes, const char* op) {
    if (peer != 0) MEMFIT_THROW(DistError, op, "peer rank {} of 1 rank", peer);
    if (bytes < 0) MEMFIT_THROW(DistError, op, "{} bytes", bytes);
  }
  std::map<int, std::deque<std::vector<std::byte>>> sent_;  // by tag, oldest first
};

}  // namespace

std::vector<int64_t> even_counts(int64_t n, int ranks) {
  std::vector<int64_t> c(static_cast<size_t>(ranks), n / ranks);
  for (int64_t r = 0; r < n % ranks; ++r) ++c[static_cast<size_t>(r)];
  return c;
}

bool launched_as_ranks() {
  // OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE; srun and other launchers the PMI/PMIx ones.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    const char* s = std::getenv(v);
    if (s && *s) return true;
  }
  return false;
}

bool built_with_mpi() {
#ifdef MEMFIT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int launched_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    const char* s = std::getenv(v);
    if (s && *s) return std::atoi(s);
  }
  return 0;
}

void abort_world(int code) {
#ifdef MEMFIT_HAVE_MPI
  if (launched_as_ranks()) mpi::abort_world(code);
#else
  (void)code;
#endif
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

std::unique_ptr<Communicator> make_world_communicator(bool threads) {
  if (!launched_as_ranks()) return make_single_communicator();
#ifdef MEMFIT_HAVE_MPI
  std::unique_ptr<Communicator> world = mpi::make_mpi_communicator(threads);
  if (check_collectives_requested()) return make_checked_communicator(std::move(world));
  return world;
#else
  (void)threads;
  MEMFIT_THROW(DistError, "dist",
               "started by a launcher (mpirun or srun) but this memfit was built without MPI: "
               "install libopenmpi-dev and rebuild (scripts/setup.sh does)");
#endif
}

}  // namespace memfit::dist
