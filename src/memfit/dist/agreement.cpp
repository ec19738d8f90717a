#include "memfit/dist/agreement.h"

#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace memfit::dist {

namespace {

uint64_t hash_field(const AgreedField& f) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of name, a NUL, value
  auto add = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  add(f.name);
  h ^= 0;
  h *= 1099511628211ull;
  add(f.value);
  return h;
}

// `text` of rank `root` on every rank.
std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  int64_t n = comm.rank() == root ? static_cast<int64_t>(text.size()) : 0;
  comm.broadcast(&n, sizeof n, root);
  std::string s = comm.rank() == root ? text : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) comm.broadcast(s.data(), n, root);
  return s;
}

}  // namespace

void check_ranks_agree(Communicator& comm, const std::vector<AgreedField>& fields) {
  const int W = comm.size();
  if (W == 1) return;
  const std::vector<int64_t> ones(static_cast<size_t>(W), 1);
  // The number of fields first (different builds of memfit may check different ones).
  const int64_t n = static_cast<int64_t>(fields.size());
  std::vector<int64_t> sizes(static_cast<size_t>(W));
  comm.all_gather(&n, sizes.data(), ones, sizeof n);
  for (int q = 1; q < W; ++q)
    if (sizes[static_cast<size_t>(q)] != sizes[0])
      MEMFIT_THROW(dist::DisagreementError, "ranks",
                   "ranks disagree about what to compare: rank 0 checks {} fields, rank {} {} "
                   "(different versions of memfit?)",
                   sizes[0], q, sizes[static_cast<size_t>(q)]);
  std::vector<uint64_t> mine;
  for (const AgreedField& f : fields) mine.push_back(hash_field(f));
  std::vector<uint64_t> all(static_cast<size_t>(W * n));
  comm.all_gather(mine.data(), all.data(), std::vector<int64_t>(static_cast<size_t>(W), n),
                  sizeof(uint64_t));
  // The first field some rank differs on, the lowest such rank, and the other fields that differ.
  int64_t first = -1;
  int rank = -1;
  std::vector<std::string> also;
  for (int64_t i = 0; i < n; ++i)
    for (int q = 1; q < W; ++q)
      if (all[static_cast<size_t>(q * n + i)] != all[static_cast<size_t>(i)]) {
        if (first < 0) {
          first = i;
          rank = q;
        } else if (i != first) {
          also.push_back(fields[static_cast<size_t>(i)].name);
        }
        break;
      }
  if (first < 0) return;
  const AgreedField& f = fields[static_cast<size_t>(first)];
  // Both values and rank 0's name of the field, on every rank, so every rank says the same.
  const std::string name = broadcast_string(comm, f.name, 0);
  const std::string v0 = broadcast_string(comm, f.value, 0);
  const std::string vq = broadcast_string(comm, f.value, rank);
  const std::string nq = broadcast_string(comm, f.name, rank);
  const std::string tail =
      also.empty() ? std::string() : fmt::format(" (also: {})", fmt::join(also, ", "));
  if (nq != name)
    MEMFIT_THROW(dist::DisagreementError, "ranks",
                 "ranks disagree about what to compare: rank 0's field {} is '{}', rank {}'s is "
                 "'{}' (different versions of memfit?)",
                 first + 1, name, rank, nq);
  MEMFIT_THROW(dist::DisagreementError, "ranks",
               "ranks disagree about {}: rank 0 has {}, rank {} has {}{}. Every rank must be "
               "started with the same options, model, data and checkpoint",
               name, v0, rank, vq, tail);
}

}  // namespace memfit::dist
