// The offloaded optimizer stepped inside the backward (--update-in-backward with
// --offload-optimizer nvme; offloaded_optimizer.h's UnitStateStream side): the streamed update's
// ring, its pieces taken in the backward's order of units and interrupted between units, so the
// next unit's first pieces are read while the backward computes it and no gradient is ever kept
// or written. Note [Update in backward], "With offload" (docs/notes/update-in-backward.md).
#include <algorithm>
#include <chrono>

#include "memfit/core/error.h"
#include "memfit/offload/offloaded_optimizer.h"

namespace memfit::offload {

namespace {

// Each piece's unit: the pieces are unit_ranges' units cut, in order, so each lies in exactly one.
std::vector<std::vector<size_t>> pieces_by_unit(const std::vector<ElementRange>& units,
                                                const std::vector<ElementRange>& pieces) {
  std::vector<std::vector<size_t>> by_unit(units.size());
  size_t u = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    while (u < units.size() && !units[u].contains(pieces[k])) ++u;
    MEMFIT_CHECK(u < units.size(), "offload", "piece [{}, {}) lies in no unit", pieces[k].begin,
                 pieces[k].end);
    by_unit[u].push_back(k);
  }
  return by_unit;
}

}  // namespace

void OffloadedOptimizer::attach_backward(const Tensor& working) {
  MEMFIT_CHECK(working.numel() == layout_.range.size(), "offload",
               "--update-in-backward: working weights of {} elements for [{}, {})",
               working.numel(), layout_.range.begin, layout_.range.end);
  pass_working_ = working;
  pass_gather_ = nullptr;
  order_pass();
}

void OffloadedOptimizer::attach_backward(WeightGather& working) {
  MEMFIT_CHECK(working.from_file(), "offload", "the working weights are not in a file");
  pass_working_ = Tensor{};
  pass_gather_ = &working;
  order_pass();
}

void OffloadedOptimizer::order_pass() {
  // The backward's order: the tail, the blocks top down, the embeddings (optim/backward_update.h),
  // over this optimizer's range (the whole layout, or a ZeRO rank's shard: its pieces are the
  // units' parts in it, and a unit outside it has none, which UnitSteps never gives).
  const std::vector<std::vector<size_t>> by_unit =
      pieces_by_unit(unit_ranges(params_), layout_.pieces);
  pass_pieces_.clear();
  pass_units_.assign(by_unit.size(), {0, 0});
  for (size_t u = by_unit.size(); u-- > 0;) {
    pass_units_[u] = {pass_pieces_.size(), by_unit[u].size()};
    pass_pieces_.insert(pass_pieces_.end(), by_unit[u].begin(), by_unit[u].end());
  }
}

void OffloadedOptimizer::pass_read(size_t position) {
  const int slot = static_cast<int>(position % kRingSlots);
  submit_unit(IoRequest::Op::read, slot, pass_pieces_[position], pass_reads_[slot]);
}

void OffloadedOptimizer::begin_pass() {
  MEMFIT_CHECK(!pass_units_.empty(), "offload",
               "--update-in-backward: a pass before attach_backward()");
  MEMFIT_CHECK(!pass_on_, "offload", "--update-in-backward: a pass begun inside another");
  pass_on_ = true;
  pass_next_ = 0;
  // The tail's first pieces are read while the forward runs.
  for (size_t j = 0; j < std::min<size_t>(2, pass_pieces_.size()); ++j) pass_read(j);
}

void OffloadedOptimizer::step_unit(size_t u, const Tensor& grads, float lr, float scale,
                                   int64_t steps, bool step) {
  const auto start = std::chrono::steady_clock::now();
  MEMFIT_CHECK(pass_on_ && u < pass_units_.size() && pass_units_[u].first == pass_next_,
               "offload",
               "--update-in-backward: unit {} stepped out of the backward's order (position {} "
               "of {} pieces)",
               u, pass_next_, pass_pieces_.size());
  const auto [first, count] = pass_units_[u];
  const ElementRange& R = layout_.range;
  const int64_t base = count ? layout_.pieces[pass_pieces_[first]].begin : 0;
  const size_t n = pass_pieces_.size();
  const size_t first_state = master_ ? 1 : 0;
  std::vector<IoWait>* log = record_waits_ ? &waits_ : nullptr;
  for (size_t c = 0; c < count; ++c) {
    // Piece j of the pass in slot j mod 3: its reads were issued two pieces ago (or by
    // begin_pass), piece j + 1's are in flight, piece j - 1's writes too.
    const size_t j = pass_next_++;
    const size_t k = pass_pieces_[j];
    const int s = static_cast<int>(j % kRingSlots);
    wait(pass_reads_[s], log);
    const ElementRange& p = layout_.pieces[k];
    if (step) {
      Optimizer& opt = *units_[k];
      std::vector<Tensor> state;
      for (size_t i = first_state; i < layout_.tensors.size(); ++i)
        state.push_back(p.size() && layout_.tensors[i].extents[k].size() ? slot_view(s, i, k)
                                                                          : Tensor{});
      opt.bind_state(std::move(state));
      opt.set_steps_taken(steps);
      Tensor w = pass_gather_ ? pass_gather_->stepped_piece(p)
                              : pass_working_.view(p.begin - R.begin, {p.size()});
      const Tensor g = grads.view(p.begin - base, {p.size()});
      if (master_) {
        Tensor m = slot_view(s, 0, k);
        opt.step_master(m, w, g, lr, scale);
      } else {
        opt.step(w, g, lr, scale);
      }
      if (pass_gather_) pass_gather_->stepped_piece_done(p);
      submit_unit(IoRequest::Op::write, s, k, pass_writes_[s]);
    }
    // Piece j + 2 goes into the slot piece j - 1 was written from, once that write is done:
    // across units too, so the next unit's first pieces load while the backward computes it.
    if (j + 2 < n) {
      wait(pass_writes_[(j + 2) % kRingSlots], log);
      pass_read(j + 2);
    }
  }
  stats_.update_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void OffloadedOptimizer::end_pass(int64_t steps) {
  MEMFIT_CHECK(pass_on_ && pass_next_ == pass_pieces_.size(), "offload",
               "--update-in-backward: the pass ended after {} of {} pieces", pass_next_,
               pass_pieces_.size());
  std::vector<IoWait>* log = record_waits_ ? &waits_ : nullptr;
  for (auto& w : pass_writes_) wait(w, log);
  pass_on_ = false;
  set_steps_taken(steps);
  if (pass_gather_) pass_gather_->end_update(steps);
}

}  // namespace memfit::offload
