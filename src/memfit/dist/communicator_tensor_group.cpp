// The tensor group's collectives on a communicator. The gathered values of a double sum or a
// maximum live on the heap for the call (size() x n elements: per-row statistics, a few KiB).
#include "memfit/dist/communicator_tensor_group.h"

#include <algorithm>
#include <vector>

#include "memfit/core/error.h"

namespace memfit::dist {
namespace {

// Every rank's n values of T, rank after rank.
template <class T>
std::vector<T> gather_all(Communicator& comm, std::span<const T> data) {
  std::vector<T> all(data.size() * static_cast<size_t>(comm.size()));
  const std::vector<int64_t> counts(static_cast<size_t>(comm.size()),
                                    static_cast<int64_t>(data.size()));
  comm.all_gather(data.data(), all.data(), counts, sizeof(T));
  return all;
}

}  // namespace

void CommunicatorTensorGroup::all_reduce_sum(std::span<float> data) {
  if (comm_.size() == 1 || data.empty()) return;
  volume_.all_reduce_bytes += static_cast<int64_t>(data.size_bytes());
  ++volume_.all_reduce_count;
  comm_.all_reduce(data);
}

void CommunicatorTensorGroup::all_reduce_sum(std::span<double> data) {
  if (comm_.size() == 1 || data.empty()) return;
  volume_.gathered_bytes += static_cast<int64_t>(data.size_bytes());
  const std::vector<double> all = gather_all<double>(comm_, data);
  const size_t n = data.size();
  for (size_t i = 0; i < n; ++i) {
    double s = all[i];
    for (int q = 1; q < comm_.size(); ++q) s += all[static_cast<size_t>(q) * n + i];
    data[i] = s;
  }
}

void CommunicatorTensorGroup::all_reduce_max(std::span<float> data) {
  if (comm_.size() == 1 || data.empty()) return;
  volume_.gathered_bytes += static_cast<int64_t>(data.size_bytes());
  const std::vector<float> all = gather_all<float>(comm_, data);
  const size_t n = data.size();
  for (size_t i = 0; i < n; ++i) {
    float m = all[i];
    for (int q = 1; q < comm_.size(); ++q) m = std::max(m, all[static_cast<size_t>(q) * n + i]);
    data[i] = m;
  }
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
  const std::vector<int64_t> counts(static_cast<size_t>(comm_.size()),
                                    static_cast<int64_t>(in.size()));
  comm_.all_gather(in.data(), out.data(), counts, sizeof(float));
}

// The communicator's reduce-scatter over equal parts (rank order; in place where `out` is this
// rank's part of `in`, which the communicator allows).
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
  const std::vector<int64_t> counts(T, static_cast<int64_t>(out.size()));
  comm_.reduce_scatter(in, out, counts);
}

}  // namespace memfit::dist
