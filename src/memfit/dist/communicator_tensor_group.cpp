// The tensor group's collectives on a communicator, a chunk at a time through the group's own
// buffers (communicator_tensor_group.h).
#include "memfit/dist/communicator_tensor_group.h"

#include <algorithm>
#include <chrono>

#include "memfit/core/error.h"

namespace memfit::dist {
namespace {

// The chunk for a group of `ranks`: a multiple of the ranks, so that an all-reduce of a chunk
// (even_counts over the ranks) receives at most the chunk.
int64_t chunk_for(int64_t floats, int ranks) {
  return std::max<int64_t>(ranks, floats / ranks * ranks);
}

// Adds the scope's wall time to `seconds`.
class Timed {
 public:
  explicit Timed(double& seconds) : seconds_(seconds) {}
  ~Timed() {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double& seconds_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace

int64_t tensor_group_buffer_bytes(int tp, bool sequence_parallel, int64_t largest_floats) {
  if (tp <= 1) return 0;
  const int64_t largest = (largest_floats + tp - 1) / tp * tp;
  const int64_t floats = chunk_for(std::min(kTensorChunkFloats, largest), tp);
  const auto one =
      static_cast<int64_t>(MemoryPool::round_up(static_cast<size_t>(floats) * sizeof(float)));
  return sequence_parallel ? 2 * one : one;
}

CommunicatorTensorGroup::CommunicatorTensorGroup(Communicator& comm, int64_t chunk_floats)
    : comm_(comm), chunk_(chunk_for(chunk_floats, comm.size())) {}

void CommunicatorTensorGroup::lend_buffers(MemoryPool& pool, bool sequence_parallel,
                                           int64_t largest_floats) {
  if (comm_.size() == 1) return;
  const int T = comm_.size();
  chunk_ = chunk_for(std::min(chunk_, (largest_floats + T - 1) / T * T), T);
  receive_ = Tensor::empty(pool, {chunk_}, DType::f32, Category::comm, "tp.receive");
  if (sequence_parallel)
    pack_ = Tensor::empty(pool, {chunk_}, DType::f32, Category::comm, "tp.pack");
}

void CommunicatorTensorGroup::start_overlap() {
  if (comm_.size() > 1 && !thread_) thread_ = std::make_unique<CommThread>();
}

void CommunicatorTensorGroup::start(const std::function<void()>& collectives) {
  if (!thread_) {
    collectives();
    return;
  }
  thread_->run([this, collectives] {
    const Timed timed(volume_.overlapped_seconds);
    collectives();
  });
}

void CommunicatorTensorGroup::finish() {
  if (thread_) thread_->wait(&volume_.waited_seconds);
}

std::span<float> CommunicatorTensorGroup::receive() {
  if (receive_.defined()) return {receive_.data<float>(), static_cast<size_t>(chunk_)};
  heap_receive_.resize(static_cast<size_t>(chunk_));
  return heap_receive_;
}

std::span<float> CommunicatorTensorGroup::pack() {
  if (pack_.defined()) return {pack_.data<float>(), static_cast<size_t>(chunk_)};
  MEMFIT_CHECK(!receive_.defined(), "tensor_parallel",
               "a reduce-scatter over the tensor group, whose buffers were lent without --sp's");
  heap_pack_.resize(static_cast<size_t>(chunk_));
  return heap_pack_;
}

void CommunicatorTensorGroup::all_reduce_sum(std::span<float> data) {
  if (comm_.size() == 1 || data.empty()) return;
  volume_.all_reduce_bytes += static_cast<int64_t>(data.size_bytes());
  ++volume_.all_reduce_count;
  const Timed timed(volume_.seconds);
  const std::span<float> buffer = receive();
  const size_t T = static_cast<size_t>(comm_.size());
  for (size_t at = 0; at < data.size(); at += static_cast<size_t>(chunk_)) {
    const size_t n = std::min(static_cast<size_t>(chunk_), data.size() - at);
    comm_.all_reduce(data.subspan(at, n), buffer.first((n + T - 1) / T * T));
  }
}

// Every rank's values of a chunk side by side in the receive buffer (as bytes of T), then
// reduce(acc, value) over the ranks in rank order, the same on every rank.
template <class T, class Reduce>
void CommunicatorTensorGroup::gather_reduce(std::span<T> data, Reduce reduce) {
  volume_.gathered_bytes += static_cast<int64_t>(data.size_bytes());
  const Timed timed(volume_.seconds);
  const size_t ranks = static_cast<size_t>(comm_.size());
  const std::span<float> buffer = receive();
  T* all = reinterpret_cast<T*>(buffer.data());
  const size_t per = std::max<size_t>(1, buffer.size_bytes() / (sizeof(T) * ranks));
  for (size_t at = 0; at < data.size(); at += per) {
    const size_t n = std::min(per, data.size() - at);
    const std::vector<int64_t> counts(ranks, static_cast<int64_t>(n));
    comm_.all_gather(data.data() + at, all, counts, static_cast<int>(sizeof(T)));
    for (size_t i = 0; i < n; ++i) {
      T acc = all[i];
      for (size_t q = 1; q < ranks; ++q) acc = reduce(acc, all[q * n + i]);
      data[at + i] = acc;
    }
  }
}

void CommunicatorTensorGroup::all_reduce_sum(std::span<double> data) {
  if (comm_.size() == 1 || data.empty()) return;
  gather_reduce(data, [](double a, double b) { return a + b; });
}

void CommunicatorTensorGroup::all_reduce_max(std::span<float> data) {
  if (comm_.size() == 1 || data.empty()) return;
  gather_reduce(data, [](float a, float b) { return std::max(a, b); });
}

void CommunicatorTensorGroup::all_gather(std::span<const float> in, std::span<float> out) {
  MEMFIT_CHECK(out.size() == in.size() * static_cast<size_t>(comm_.size()), "all_gather",
               "out holds {} floats, want {} ({} ranks x {})", out.size(),
               in.size() * static_cast<size_t>(comm_.size()), comm_.size(), in.size());
  if (in.empty() || comm_.size() == 1) {
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  volume_.gathered_bytes += static_cast<int64_t>(in.size_bytes());
  const Timed timed(volume_.seconds);
  const std::vector<int64_t> counts(static_cast<size_t>(comm_.size()),
                                    static_cast<int64_t>(in.size()));
  comm_.all_gather(in.data(), out.data(), counts, sizeof(float));
}

// The communicator's reduce-scatter over equal parts, a chunk of each part at a time: each
// rank's piece of the chunk packed side by side (so `out` may be this rank's part of `in`: a
// chunk's sums land only where the chunks already packed were read), then summed in rank order.
void CommunicatorTensorGroup::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  const size_t T = static_cast<size_t>(comm_.size());
  MEMFIT_CHECK(in.size() % T == 0 && out.size() == in.size() / T, "reduce_scatter_sum",
               "in holds {} floats, out {}: want {} ranks' equal parts", in.size(), out.size(), T);
  if (in.empty() || T == 1) {
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  volume_.reduce_scatter_bytes += static_cast<int64_t>(in.size_bytes());
  ++volume_.reduce_scatter_count;
  const Timed timed(volume_.seconds);
  const std::span<float> packed = pack(), buffer = receive();
  const size_t m = out.size(), per = static_cast<size_t>(chunk_) / T;
  for (size_t at = 0; at < m; at += per) {
    const size_t n = std::min(per, m - at);
    for (size_t q = 0; q < T; ++q)
      std::copy_n(in.data() + q * m + at, n, packed.data() + q * n);
    const std::vector<int64_t> counts(T, static_cast<int64_t>(n));
    comm_.reduce_scatter_async(packed.first(T * n), out.subspan(at, n), counts,
                               buffer.first(T * n))
        ->wait();
  }
}

}  // namespace memfit::dist
