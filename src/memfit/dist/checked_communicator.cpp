#include "memfit/dist/checked_communicator.h"

#include <cstdlib>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace memfit::dist {

static_assert(sizeof(CollectiveRecord) == 64, "a record is 64 plain bytes");

namespace {

const char* kind_name(int64_t kind) {
  switch (kind) {
    case CollectiveRecord::reduce_scatter: return "reduce_scatter";
    case CollectiveRecord::all_gather: return "all_gather";
    case CollectiveRecord::all_reduce: return "all_reduce";
    case CollectiveRecord::broadcast: return "broadcast";
    case CollectiveRecord::barrier: return "barrier";
    case CollectiveRecord::end: return "end";
    case CollectiveRecord::split: return "split";
  }
  return "unknown";
}

uint64_t hash_counts(std::span<const int64_t> counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts' bytes
  for (int64_t c : counts)
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(c) >> (8 * i) & 0xff;
      h *= 1099511628211ull;
    }
  return h;
}

int64_t sum(std::span<const int64_t> counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

class CheckedCommunicator final : public Communicator {
 public:
  explicit CheckedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string describe() const override {
    return inner_->describe() + ", every collective checked (MEMFIT_CHECK_COLLECTIVES)";
  }
  void set_pool(MemoryPool* pool) override {
    pool_ = pool;
    inner_->set_pool(pool);
  }
  void set_timeout(double seconds) override {
    timeout_s_ = seconds;
    inner_->set_timeout(seconds);
  }

  std::unique_ptr<Request> reduce_scatter_async(std::span<const float> in, std::span<float> out,
                                                std::span<const int64_t> counts,
                                                std::span<float> receive) override {
    agree(CollectiveRecord::reduce_scatter, sum(counts), 4, -1, hash_counts(counts));
    return inner_->reduce_scatter_async(in, out, counts, receive);
  }
  std::unique_ptr<Request> reduce_scatter_bf16_async(std::span<const uint16_t> in,
                                                     std::span<uint16_t> out,
                                                     std::span<const int64_t> counts,
                                                     std::span<uint16_t> receive) override {
    agree(CollectiveRecord::reduce_scatter, sum(counts), 2, -1, hash_counts(counts));
    return inner_->reduce_scatter_bf16_async(in, out, counts, receive);
  }
  std::unique_ptr<Request> all_gather_async(const void* in, void* out,
                                            std::span<const int64_t> counts,
                                            int elem_bytes) override {
    agree(CollectiveRecord::all_gather, sum(counts), elem_bytes, -1, hash_counts(counts));
    return inner_->all_gather_async(in, out, counts, elem_bytes);
  }
  std::unique_ptr<Request> all_reduce_async(std::span<float> data,
                                            std::span<float> receive) override {
    agree(CollectiveRecord::all_reduce, static_cast<int64_t>(data.size()), 4, -1, 0);
    return inner_->all_reduce_async(data, receive);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    agree(CollectiveRecord::broadcast, bytes, 1, root, 0);
    inner_->broadcast(data, bytes, root);
  }
  void barrier() override {
    agree(CollectiveRecord::barrier, 0, 0, -1, 0);
    inner_->barrier();
  }
  // Point to point is between two ranks only: nothing to agree on.
  std::unique_ptr<Request> send_async(const void* data, int64_t bytes, int peer,
                                      int tag) override {
    return inner_->send_async(data, bytes, peer, tag);
  }
  std::unique_ptr<Request> recv_async(void* data, int64_t bytes, int peer, int tag) override {
    return inner_->recv_async(data, bytes, peer, tag);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    agree(CollectiveRecord::split, 0, 0, -1, 0);  // colors and keys differ between ranks
    std::unique_ptr<Communicator> group = make_checked_communicator(inner_->split(color, key));
    group->set_timeout(timeout_s_);
    return group;
  }
  void end() override {
    agree(CollectiveRecord::end, 0, 0, -1, 0);
    inner_->end();
  }

 private:
  // Every rank's record of the collective about to be issued; a DisagreementError (on every
  // rank alike) unless all equal rank 0's.
  void agree(int64_t kind, int64_t count, int64_t elem_bytes, int64_t root, uint64_t hash) {
    CollectiveRecord mine;
    mine.seq = ++seq_;
    mine.kind = kind;
    mine.count = count;
    mine.elem_bytes = elem_bytes;
    mine.root = root;
    mine.counts_hash = hash;
    const int W = inner_->size();
    std::vector<CollectiveRecord> all(static_cast<size_t>(W));
    const std::vector<int64_t> ones(static_cast<size_t>(W), 1);
    inner_->all_gather(&mine, all.data(), ones, sizeof(CollectiveRecord));
    const int q = first_divergent(all.data(), W);
    if (q < 0) return;
    MEMFIT_THROW(dist::DisagreementError, "check-collectives",
                 "the ranks' collectives diverge: rank 0 issued {}, rank {} issued {} (found on "
                 "rank {} by MEMFIT_CHECK_COLLECTIVES)",
                 all[0].describe(), q, all[static_cast<size_t>(q)].describe(), inner_->rank());
  }

  std::unique_ptr<Communicator> inner_;
  int64_t seq_ = 0;
};

}  // namespace

std::string CollectiveRecord::describe() const {
  if (kind == end) return fmt::format("collective {}: none (the end of its run)", seq);
  std::string what = fmt::format("collective {}: {}", seq, kind_name(kind));
  if (kind == barrier || kind == split) return what;
  if (kind == broadcast) return fmt::format("{} of {} bytes from rank {}", what, count, root);
  std::string type = (kind == all_gather) ? fmt::format("{}-byte elements", elem_bytes)
                                          : std::string(elem_bytes == 4 ? "f32" : "?");
  what = fmt::format("{} of {} x {}", what, count, type);
  if (kind == all_gather || kind == reduce_scatter)
    what += fmt::format(" (counts hash {:016x})", counts_hash);
  return what;
}

int first_divergent(const CollectiveRecord* records, int ranks) {
  for (int q = 1; q < ranks; ++q)
    if (!(records[q] == records[0])) return q;
  return -1;
}

bool check_collectives_requested() {
  const char* v = std::getenv("MEMFIT_CHECK_COLLECTIVES");
  return v && *v && std::string_view(v) != "0";
}

std::unique_ptr<Communicator> make_checked_communicator(std::unique_ptr<Communicator> inner) {
  return std::make_unique<CheckedCommunicator>(std::move(inner));
}

}  // namespace memfit::dist
