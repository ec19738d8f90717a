// A rank's slice of a vocabulary split across a tensor group: what the vocabulary-parallel
// embedding, LM head and cross-entropy (model/vocab_parallel_crossentropy.h) cut, and what
// ModelConfig::local_vocab sizes. Apart from them so that what reads configs (the fuzz
// harnesses' small library) links no kernels. Note [Tensor parallel].
#pragma once

#include <cstdint>

namespace memfit {

// A rank's part of a vocabulary of `vocab` entries split over `ranks` ranks: the padded
// vocabulary is `ranks` slices of `width` columns (the vocabulary rounded up to a multiple of
// ranks * align, then divided), rank i's beginning at i * width. `real` of its columns are
// vocabulary entries; the rest (the last ranks', where ranks * align does not divide the
// vocabulary) are padding, and may be all of them.
struct VocabShard {
  int64_t begin = 0, width = 0, real = 0;
};
// ConfigError for vocab < 1, ranks < 1, rank outside [0, ranks) or align < 1.
VocabShard vocab_shard(int64_t vocab, int ranks, int rank, int64_t align = 1);

}  // namespace memfit
