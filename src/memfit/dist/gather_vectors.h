// Every rank's list of records, whatever its length, on every rank: the pipeline's parts of the
// clipping norm (train/update.cpp) and the fused update's per-unit checks
// (train/train_run_setup.cpp) gather a stage's own list each, in stage order.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "memfit/dist/communicator.h"

namespace memfit::dist {

// The concatenation, in rank order, of every rank's `mine` (of trivially copyable records): an
// all-gather of the counts, then one of the records.
template <class T>
std::vector<T> all_gather_vectors(Communicator& comm, const std::vector<T>& mine) {
  static_assert(std::is_trivially_copyable_v<T>, "records are sent as bytes");
  const size_t P = static_cast<size_t>(comm.size());
  std::vector<int64_t> counts(P);
  const int64_t n = static_cast<int64_t>(mine.size());
  comm.all_gather(&n, counts.data(), std::vector<int64_t>(P, 1), sizeof(int64_t));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<T> all(static_cast<size_t>(total));
  comm.all_gather(mine.data(), all.data(), counts, sizeof(T));
  return all;
}

}  // namespace memfit::dist
