// BPE merging by rank; see hf_bpe.h.
#include "memfit/io/tokenizer/hf_bpe.h"

namespace memfit::io {

bool BpeCache::append(const std::string& key, std::vector<int32_t>& out) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeCache::put(std::string key, std::vector<int32_t> ids) {
  std::lock_guard lock(mu_);
  if (map_.size() >= kLimit) map_.clear();
  map_.emplace(std::move(key), std::move(ids));
}

void BpeMerges::add(int32_t left, int32_t right, int32_t result, int32_t rank) {
  merges_[bpe_pair_key(left, right)] = Merge{rank, result};
}

// transformers.js keeps the candidate pairs in a priority queue scored rank + position / length
// (the position of the pair's left symbol in the piece as first cut, which a merged symbol
// inherits from its left part) and merges one pair at a time. Since position / length < 1, that
// is the order (rank, left position) used here. Entries go stale when a neighbour merges; they
// are recognised when popped by their ids and adjacency.
void BpeMerges::merge(std::vector<BpeSymbol>& symbols) const {
  const int32_t n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  BpeQueue heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    const int32_t right = next[left];
    const int32_t a = symbols[left].id, b = symbols[right].id;
    if (a < 0 || b < 0) return;
    if (auto it = merges_.find(bpe_pair_key(a, b)); it != merges_.end())
      heap.push(BpeCandidate{it->second.rank, left, right, a, b});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const BpeCandidate e = heap.top();
    heap.pop();
    if (next[e.left] != e.right || symbols[e.left].id != e.left_id ||
        symbols[e.right].id != e.right_id)
      continue;
    symbols[e.left].id = merges_.at(bpe_pair_key(e.left_id, e.right_id)).result;
    symbols[e.left].end = symbols[e.right].end;
    symbols[e.right].id = -2;  // gone
    next[e.left] = next[e.right];
    if (next[e.left] >= 0) prev[next[e.left]] = e.left;
    push(prev[e.left]);
    push(e.left);
  }
  int32_t kept = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[kept++] = symbols[i];
  symbols.resize(static_cast<size_t>(kept));
}

}  // namespace memfit::io
