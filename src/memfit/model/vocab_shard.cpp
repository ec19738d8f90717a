#include "memfit/model/vocab_shard.h"

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit {

VocabShard vocab_shard(int64_t vocab, int ranks, int rank, int64_t align) {
  if (vocab < 1 || ranks < 1 || align < 1 || rank < 0 || rank >= ranks)
    MEMFIT_THROW(ConfigError, "vocab_shard", "vocabulary {} over {} ranks (rank {}, align {})",
                 vocab, ranks, rank, align);
  const int64_t unit = ranks * align;
  const int64_t padded = (vocab + unit - 1) / unit * unit;
  VocabShard s;
  s.width = padded / ranks;
  s.begin = s.width * rank;
  s.real = std::clamp<int64_t>(vocab - s.begin, 0, s.width);
  return s;
}

}  // namespace memfit
