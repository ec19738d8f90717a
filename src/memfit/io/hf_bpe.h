// Byte-pair merging by rank over token ids, the model step of a tokenizer.json BPE: the same
// sequence of merges as transformers.js's BPE.bpe (lowest rank first, the leftmost of equal
// ranks first), in O(n log n) for pieces of any length: Llama 2's tokenizer has no
// pre-tokenizer, so a whole document is one piece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace memfit::io {

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
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace memfit::io
