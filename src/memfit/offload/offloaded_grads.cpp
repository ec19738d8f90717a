// Gradients on disk per unit (offloaded_grads.h; Note [NVMe offload], "Gradients on disk").
#include "memfit/offload/offloaded_grads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/state/shard.h"

namespace memfit::offload {

namespace fs = std::filesystem;

namespace {
size_t unit_bytes(const ElementRange& u) { return align_up(static_cast<size_t>(u.size()) * 4); }
}  // namespace

GradFileLayout make_grad_file_layout(const ParamLayout& layout, int grad_accum,
                                     int64_t max_piece) {
  GradFileLayout g;
  g.grad_accum = grad_accum;
  g.units = unit_ranges(layout);
  uint64_t at = kHeaderBytes;
  for (const ElementRange& u : g.units) {
    g.file_offsets.push_back(at);
    at += unit_bytes(u);
  }
  g.file_bytes = at;
  g.edge_bytes = unit_bytes(g.units.front());
  g.tail_bytes = unit_bytes(g.units.back());
  for (size_t u = 1; u + 1 < g.units.size(); ++u)
    g.slot_bytes = std::max(g.slot_bytes, unit_bytes(g.units[u]));
  // With accumulation block l-1's read is in flight while block l computes and block l+1's
  // write drains: three slots. Without, nothing is read back: two.
  g.block_slots = grad_accum > 1 ? 3 : 2;
  // A piece starts anywhere in its unit: its read is rounded out to pages, one more at most.
  int64_t largest = 0;
  for (const ElementRange& u : g.units) largest = std::max(largest, std::min(u.size(), max_piece));
  g.update_slot_bytes = align_up(static_cast<size_t>(largest) * 4) + kIoAlign;
  return g;
}

size_t GradFileLayout::ram_bytes() const {
  const size_t backward = edge_bytes + tail_bytes + static_cast<size_t>(block_slots) * slot_bytes;
  const size_t update = static_cast<size_t>(kRingSlots) * update_slot_bytes;
  return MemoryPool::round_up(std::max(backward, update) + kIoAlign);
}

size_t GradFileLayout::unit_of(int64_t e) const {
  const auto it = std::upper_bound(units.begin(), units.end(), e,
                                   [](int64_t x, const ElementRange& u) { return x < u.end; });
  MEMFIT_CHECK(it != units.end(), "offload", "element {} outside the layout", e);
  return static_cast<size_t>(it - units.begin());
}

uint64_t GradFileLayout::piece_read_bytes(const ElementRange& piece) const {
  const size_t u = unit_of(piece.begin);
  const uint64_t from = file_offsets[u] + static_cast<uint64_t>(piece.begin - units[u].begin) * 4;
  const uint64_t start = from / kIoAlign * kIoAlign;
  return align_up(from + static_cast<uint64_t>(piece.size()) * 4) - start;
}

uint64_t GradFileLayout::backward_written() const {
  uint64_t b = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const bool edge = u == 0 || u + 1 == units.size();
    b += unit_bytes(units[u]) * (edge ? 1 : static_cast<uint64_t>(grad_accum));
  }
  return b;
}

uint64_t GradFileLayout::backward_read() const {
  uint64_t b = 0;
  for (size_t u = 1; u + 1 < units.size(); ++u)
    b += unit_bytes(units[u]) * static_cast<uint64_t>(grad_accum - 1);
  return b;
}

uint64_t GradFileLayout::io_bytes_per_step(const std::vector<ElementRange>& pieces) const {
  uint64_t b = backward_written() + backward_read();
  for (const ElementRange& p : pieces) b += piece_read_bytes(p);
  return b;
}

OffloadedGrads::OffloadedGrads(const ParamLayout& layout, MemoryPool& pool, const fs::path& dir,
                               const std::string& run, int grad_accum, int64_t max_piece)
    : layout_(layout), fl_(make_grad_file_layout(layout, grad_accum, max_piece)) {
  MEMFIT_CHECK(grad_accum >= 1, "offload", "--grad-accum {}", grad_accum);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    MEMFIT_THROW(IoError, "offload", "--offload-dir {}: cannot create the directory: {}",
                 dir.string(), ec ? ec.message() : "not a directory");
  const uint64_t free = free_disk_bytes(dir);
  if (fl_.file_bytes > free)
    MEMFIT_THROW(IoError, "offload",
                 "--offload-dir {}: the offloaded gradients need {} bytes ({:.2f} GiB) of disk "
                 "and the filesystem has {} bytes ({:.2f} GiB) free",
                 dir.string(), fl_.file_bytes, fl_.file_bytes / 1073741824.0, free,
                 free / 1073741824.0);
  io_ = make_io_engine();
  std::vector<int64_t> starts;
  for (const ElementRange& u : fl_.units) starts.push_back(u.begin);
  nlohmann::json header = {{"memfit_offload", 1},
                           {"run", run},
                           {"tensor", "grads"},
                           {"dtype", "F32"},
                           {"numel", layout.total()},
                           {"layout", {{"elements", layout.total()}, {"unit_starts", cut_points(starts)}}},
                           {"step", 0}};
  file_ = std::make_unique<ScratchFile>(dir / fmt::format("{}.grads.offload", run), fl_.file_bytes,
                                        std::move(header));
  buffer_ = Tensor::empty(pool, {static_cast<int64_t>(fl_.ram_bytes())}, DType::u8,
                          Category::grads, "grads.units");
  const auto addr = reinterpret_cast<uintptr_t>(buffer_.raw_data());
  base_ = align_up(addr) - addr;
  // The edge units' views, for the run; a block's when its backward is entered.
  const ElementRange& e = fl_.units.front();
  const ElementRange& t = fl_.units.back();
  layout_.bind(views_, at(0, e.size()), e);
  layout_.bind(views_, at(fl_.edge_bytes, t.size()), t);
  slot_writes_.resize(static_cast<size_t>(fl_.block_slots));
  slot_reads_.resize(static_cast<size_t>(fl_.block_slots));
  slot_read_of_.assign(static_cast<size_t>(fl_.block_slots), -1);
  update_reads_.resize(kRingSlots);
  checks_.resize(fl_.units.size());
}

OffloadedGrads::~OffloadedGrads() {
  // No request may outlive the buffer it reads into or writes from.
  try {
    if (io_) io_->wait_all();
  } catch (const std::exception&) {
  }
}

char* OffloadedGrads::base() const { return static_cast<char*>(buffer_.raw_data()) + base_; }

Tensor OffloadedGrads::at(size_t offset, int64_t n) const {
  return buffer_.view_bytes(base_ + offset, {n}, DType::f32);
}

char* OffloadedGrads::block_buffer(int slot) const {
  return base() + fl_.edge_bytes + fl_.tail_bytes + static_cast<size_t>(slot) * fl_.slot_bytes;
}

uint64_t OffloadedGrads::submit(IoRequest::Op op, size_t unit, char* buffer) {
  IoRequest r;
  r.op = op;
  r.fd = file_->fd();
  r.offset = fl_.file_offsets[unit];
  r.buffer = buffer;
  r.bytes = unit_bytes(fl_.units[unit]);  // the padding past the unit is its own
  r.file = file_->path().string();
  (op == IoRequest::Op::read ? stats_.bytes_read : stats_.bytes_written) += r.bytes;
  return io_->submit(std::move(r));
}

void OffloadedGrads::wait(std::vector<uint64_t>& tickets) {
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t t : tickets) io_->wait(t);
  tickets.clear();
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void OffloadedGrads::zero() {
  io_->wait_all();  // the last step's reads and writes (none are left in flight normally)
  for (auto& t : slot_writes_) t.clear();
  for (auto& t : slot_reads_) t.clear();
  for (auto& t : update_reads_) t.clear();
  edge_writes_.clear();
  slot_read_of_.assign(slot_read_of_.size(), -1);
  m_ = -1;
}

void OffloadedGrads::begin_micro_batch() {
  ++m_;
  MEMFIT_CHECK(m_ < fl_.grad_accum, "offload", "micro-batch {} of a step of {}", m_ + 1,
               fl_.grad_accum);
  // The edge units stay in RAM for the whole step: zeroed by its first micro-batch only, as
  // zero_grad zeroes the slab. (The update's ring, which shares the buffer, is done by now.)
  if (m_ == 0) std::memset(base(), 0, fl_.edge_bytes + fl_.tail_bytes);
}

void OffloadedGrads::enter_backward(int layer) {
  const int S = fl_.block_slots;
  const int slot = layer % S;
  const size_t s = static_cast<size_t>(slot);
  const size_t unit = static_cast<size_t>(1 + layer);
  char* buf = block_buffer(slot);
  if (m_ == 0) {
    wait(slot_writes_[s]);  // block layer + S's write from this slot
    std::memset(buf, 0, fl_.slot_bytes);
  } else {
    // The sums so far, as the slab in RAM holds them: read now unless prefetched.
    if (slot_read_of_[s] != layer) {
      wait(slot_writes_[s]);
      slot_reads_[s].push_back(submit(IoRequest::Op::read, unit, buf));
    }
    wait(slot_reads_[s]);
    slot_read_of_[s] = -1;
    // Block layer - 1's read into its slot (block layer + 2's, once written) while this one
    // computes.
    if (layer > 0) {
      const size_t p = static_cast<size_t>((layer - 1) % S);
      wait(slot_writes_[p]);
      slot_reads_[p].push_back(submit(IoRequest::Op::read, unit - 1, block_buffer(static_cast<int>(p))));
      slot_read_of_[p] = layer - 1;
    }
  }
  layout_.bind(views_, at(static_cast<size_t>(buf - base()), fl_.units[unit].size()),
               fl_.units[unit]);
}

void OffloadedGrads::check(size_t unit, Tensor g) {
  // As update.cpp's check of a unit of the slab in RAM: the same calls on the same elements.
  if (inv_scale_) {
    const kernels::UnscaleResult r = kernels::unscale_and_check(g, *inv_scale_);
    checks_[unit] = {r.finite, r.sum_squares};
  } else {
    const double s = kernels::sum_squares(g);
    checks_[unit] = {std::isfinite(s), s};
  }
}

void OffloadedGrads::done(int part) {
  const int n_layer = static_cast<int>(fl_.units.size()) - 2;
  if (part == n_layer || part < 0) {
    // The edge units: final after the step's last backward, then written once.
    if (!last()) return;
    const size_t unit = part < 0 ? 0 : fl_.units.size() - 1;
    char* buf = part < 0 ? base() : base() + fl_.edge_bytes;
    check(unit, at(static_cast<size_t>(buf - base()), fl_.units[unit].size()));
    edge_writes_.push_back(submit(IoRequest::Op::write, unit, buf));
  } else {
    const size_t unit = static_cast<size_t>(1 + part);
    const size_t s = static_cast<size_t>(part % fl_.block_slots);
    char* buf = block_buffer(static_cast<int>(s));
    if (last()) check(unit, at(static_cast<size_t>(buf - base()), fl_.units[unit].size()));
    slot_writes_[s].push_back(submit(IoRequest::Op::write, unit, buf));
  }
  if (part < 0) {
    // The backward is over: every write lands before the next micro-batch reads or the
    // update reads (the update's ring reuses these buffers).
    for (auto& t : slot_writes_) wait(t);
    wait(edge_writes_);
  }
}

void OffloadedGrads::submit_piece(const ElementRange& piece, int slot) {
  const size_t u = fl_.unit_of(piece.begin);
  const uint64_t from = fl_.file_offsets[u] + static_cast<uint64_t>(piece.begin - fl_.units[u].begin) * 4;
  IoRequest r;
  r.op = IoRequest::Op::read;
  r.fd = file_->fd();
  r.offset = from / kIoAlign * kIoAlign;
  r.buffer = base() + static_cast<size_t>(slot) * fl_.update_slot_bytes;
  r.bytes = fl_.piece_read_bytes(piece);
  r.file = file_->path().string();
  stats_.bytes_read += r.bytes;
  update_read_ += r.bytes;
  update_reads_[static_cast<size_t>(slot)].push_back(io_->submit(std::move(r)));
}

Tensor OffloadedGrads::wait_piece(const ElementRange& piece, int slot) {
  wait(update_reads_[static_cast<size_t>(slot)]);
  const size_t u = fl_.unit_of(piece.begin);
  const uint64_t from = fl_.file_offsets[u] + static_cast<uint64_t>(piece.begin - fl_.units[u].begin) * 4;
  return at(static_cast<size_t>(slot) * fl_.update_slot_bytes + from % kIoAlign, piece.size());
}

}  // namespace memfit::offload
