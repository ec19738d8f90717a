#include "memfit/dist/tied_gradient.h"

#include <algorithm>

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

TiedGradient::TiedGradient(Communicator& pipe, ElementRange table, MemoryPool& pool)
    : pipe_(pipe), table_(table), chunk_(chunk_floats(table.size())) {
  MEMFIT_CHECK(pipe.size() > 1 && (pipe.rank() == 0 || pipe.rank() == pipe.size() - 1) &&
                   !table.empty(),
               "pipeline", "a tied table's gradient sum on stage {} of {} over {} elements",
               pipe.rank(), pipe.size(), table.size());
  buffer_ = pool.allocate(static_cast<size_t>(chunk_) * sizeof(float), Category::comm, "pp.tied");
}

void TiedGradient::sum(Tensor& grads) {
  MEMFIT_CHECK(grads.dtype() == DType::f32 && grads.numel() >= table_.end, "pipeline",
               "a tied table's gradient at [{}, {}) of a slab of {} {}", table_.begin,
               table_.end, grads.numel(), dtype_name(grads.dtype()));
  const bool first = pipe_.rank() == 0;
  const int peer = first ? pipe_.size() - 1 : 0;
  float* g = grads.data<float>() + table_.begin;
  float* theirs = static_cast<float*>(buffer_.data());
  for (int64_t a = 0; a < table_.size(); a += chunk_) {
    const int64_t n = std::min(chunk_, table_.size() - a);
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    auto send = pipe_.send_async(g + a, bytes, peer, kTiedTag);
    pipe_.recv(theirs, bytes, peer, kTiedTag);
    send->wait();  // mine has left: it may change now
    // The first stage's plus the last stage's, on both (a sum of two is the same bits either
    // way round; written in one order for the reader).
    for (int64_t i = 0; i < n; ++i)
      g[a + i] = first ? g[a + i] + theirs[i] : theirs[i] + g[a + i];
  }
}

}  // namespace memfit::dist
