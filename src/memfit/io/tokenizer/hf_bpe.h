// Byte-pair merging by rank over token ids, the model step of a tokenizer.json BPE: the same
// sequence of merges as transformers.js's BPE.bpe (lowest rank first, the leftmost of equal
// ranks first), in O(n log n) for pieces of any length: Llama 2's tokenizer has no
// pre-tokenizer, so a whole document is one piece. Also the pieces GPT-2's round-based merge
// (gpt2_tokenizer.cpp) shares with it: the pair key, the queue of candidates, the word cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

namespace memfit::io {

// The key of the adjacent pair (left id, right id) in a table of merges.
inline uint64_t bpe_pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A merge waiting in the queue: the symbols at positions `left` and `right`, which held
// left_id and right_id when it was queued (stale once either changes). Popped in (rank, left)
// order: lowest rank first, the leftmost of equal ranks first.
struct BpeCandidate {
  int32_t rank, left, right, left_id, right_id;
  bool operator>(const BpeCandidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};
using BpeQueue =
    std::priority_queue<BpeCandidate, std::vector<BpeCandidate>, std::greater<BpeCandidate>>;

// Pre-token -> ids. Text repeats words, so this saves most BPE work. Thread-safe; bounded: it
// is cleared when it reaches kLimit entries.
class BpeCache {
 public:
  // Appends the ids cached for `key` to `out` and returns true; false if there are none.
  bool append(const std::string& key, std::vector<int32_t>& out);
  void put(std::string key, std::vector<int32_t> ids);

 private:
  static constexpr size_t kLimit = 1 << 18;
  std::mutex mu_;
  std::unordered_map<std::string, std::vector<int32_t>> map_;
};

// One symbol of a piece being merged: a token id (or -1: not in the vocabulary, never merged)
// and the bytes of the piece it covers.
struct BpeSymbol {
  int32_t id;
  int32_t begin, end;
};

class BpeMerges {
 public:
  // Merge rule `rank`: (left, right) -> result. A pair given twice keeps its last rank, as a
  // JavaScript Map built from the merges list does.
  void add(int32_t left, int32_t right, int32_t result, int32_t rank);
  size_t size() const { return merges_.size(); }

  // Merges `symbols` in place until no adjacent pair has a rule.
  void merge(std::vector<BpeSymbol>& symbols) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace memfit::io
