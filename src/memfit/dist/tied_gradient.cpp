// The tied table's gradient summed between the first and last pipeline stages
// (dist/tied_gradient.h).
#include "memfit/dist/tied_gradient.h"

#include <algorithm>
#include <utility>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"

namespace memfit::dist {

namespace {

constexpr int kTiedTag = 2;  // after the runner's activation (0) and gradient (1) tags
constexpr int64_t kChunkFloats = int64_t{1} << 20;  // 4 MiB a message

int64_t chunk_floats(int64_t table_floats) { return std::min(table_floats, kChunkFloats); }

}  // namespace

int64_t tied_gradient_buffer_bytes(int stage, int stages, int64_t table_floats) {
  if (stages < 2 || table_floats < 1 || (stage != 0 && stage != stages - 1)) return 0;
  return static_cast<int64_t>(MemoryPool::round_up(
      static_cast<size_t>(chunk_floats(table_floats)) * sizeof(float)));
}

std::vector<TiedPiece> tied_shard_pieces(std::span<const ElementRange> first,
                                         std::span<const ElementRange> last, ElementRange table,
                                         ElementRange copy, const GridShape& shape,
                                         const GridCoords& me, int64_t sums_begin) {
  MEMFIT_CHECK(table.size() == copy.size() && first.size() == last.size() &&
                   static_cast<int>(first.size()) == shape.data &&
                   (me.pipeline == 0 || me.pipeline == shape.pipeline - 1),
               "pipeline", "a tied table's pieces on stage {} of {}: a table of {} and a copy of {}",
               me.pipeline, shape.pipeline, table.size(), copy.size());
  const bool is_first = me.pipeline == 0;
  // This rank's part of the table, in the table's own elements [0, n).
  auto part = [](ElementRange shard, ElementRange t) {
    const ElementRange p = shard.intersect(t);
    return ElementRange{p.begin - t.begin, p.end - t.begin};
  };
  const ElementRange mine =
      is_first ? part(first[static_cast<size_t>(me.data)], table)
               : part(last[static_cast<size_t>(me.data)], copy);
  const int64_t base = (is_first ? table.begin : copy.begin) - sums_begin;
  std::vector<TiedPiece> out;
  for (size_t d = 0; d < first.size(); ++d) {
    const ElementRange theirs = is_first ? part(last[d], copy) : part(first[d], table);
    const ElementRange both = mine.intersect(theirs);
    if (both.empty()) continue;
    const GridCoords peer{static_cast<int>(d), is_first ? shape.pipeline - 1 : 0, me.tensor};
    out.push_back({grid_rank(shape, peer), base + both.begin, both.size()});
  }
  return out;
}

TiedGradient::TiedGradient(Communicator& pipe, ElementRange table, MemoryPool& pool)
    : comm_(pipe),
      pieces_{{pipe.rank() == 0 ? pipe.size() - 1 : 0, table.begin, table.size()}},
      first_(pipe.rank() == 0),
      chunk_(chunk_floats(table.size())) {
  MEMFIT_CHECK(pipe.size() > 1 && (pipe.rank() == 0 || pipe.rank() == pipe.size() - 1) &&
                   !table.empty(),
               "pipeline", "a tied table's gradient sum on stage {} of {} over {} elements",
               pipe.rank(), pipe.size(), table.size());
  buffer_ = pool.allocate(static_cast<size_t>(chunk_) * sizeof(float), Category::comm, "pp.tied");
}

TiedGradient::TiedGradient(Communicator& world, std::vector<TiedPiece> pieces,
                           int64_t table_floats, bool first_stage, MemoryPool& pool)
    : comm_(world),
      pieces_(std::move(pieces)),
      first_(first_stage),
      chunk_(chunk_floats(table_floats)) {
  MEMFIT_CHECK(table_floats > 0, "pipeline", "a tied table's gradient sum over no element");
  buffer_ = pool.allocate(static_cast<size_t>(chunk_) * sizeof(float), Category::comm, "pp.tied");
}

void TiedGradient::sum(Tensor& sums) {
  const bool bf16 = sums.dtype() == DType::bf16;
  const int64_t esize = static_cast<int64_t>(dtype_size(sums.dtype()));
  for (const TiedPiece& p : pieces_) {
    MEMFIT_CHECK((bf16 || sums.dtype() == DType::f32) && p.at >= 0 &&
                     sums.numel() >= p.at + p.count,
                 "pipeline", "a tied table's gradient at [{}, {}) of summed gradients of {} {}",
                 p.at, p.at + p.count, sums.numel(), dtype_name(sums.dtype()));
    char* g = static_cast<char*>(sums.raw_data()) + p.at * esize;
    for (int64_t a = 0; a < p.count; a += chunk_) {
      const int64_t n = std::min(chunk_, p.count - a);
      const int64_t bytes = n * esize;
      char* mine = g + a * esize;
      auto send = comm_.send_async(mine, bytes, p.peer, kTiedTag);
      comm_.recv(buffer_.data(), bytes, p.peer, kTiedTag);
      send->wait();  // mine has left: it may change now
      // The first stage's plus the last stage's, on both (a sum of two is the same bits either
      // way round; written in one order for the reader). bf16 sums (--grad-dtype bf16, Note
      // [Gradients in bf16]) are added in f32 and rounded once.
      if (bf16) {
        uint16_t* m = reinterpret_cast<uint16_t*>(mine);
        const uint16_t* theirs = static_cast<const uint16_t*>(buffer_.data());
        for (int64_t i = 0; i < n; ++i) {
          const float x = f32_from_bf16(m[i]), y = f32_from_bf16(theirs[i]);
          m[i] = bf16_from_f32(first_ ? x + y : y + x);
        }
      } else {
        float* m = reinterpret_cast<float*>(mine);
        const float* theirs = static_cast<const float*>(buffer_.data());
        for (int64_t i = 0; i < n; ++i) m[i] = first_ ? m[i] + theirs[i] : theirs[i] + m[i];
      }
    }
  }
}

}  // namespace memfit::dist
