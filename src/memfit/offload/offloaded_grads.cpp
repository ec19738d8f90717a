// Gradients on disk per unit (offloaded_grads.h; Note [NVMe offload], "Gradients on disk").
#include "memfit/offload/offloaded_grads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/bf16_check.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/state/shard.h"

namespace memfit::offload {

namespace fs = std::filesystem;

namespace {
// A unit's f32 buffer in RAM (what the backward writes), rounded to pages.
size_t unit_bytes(const ElementRange& u) { return align_up(static_cast<size_t>(u.size()) * 4); }
size_t unit_bytes(const ElementRange& u, DType t) {
  return align_up(static_cast<size_t>(u.size()) * dtype_size(t));
}

// f32 gradients rounded to bf16 (nearest even) into the first half of their own bytes, front to
// back: element i's bf16 goes where element i/2's f32 was, already read. Sequential, since a
// parallel pass would overwrite what another thread has yet to read (as UnitGrads packs).
uint16_t* pack_bf16(char* buffer, int64_t n) {
  const float* x = reinterpret_cast<const float*>(buffer);
  uint16_t* out = reinterpret_cast<uint16_t*>(buffer);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = bf16_from_f32(v);
  }
  return out;
}
}  // namespace

GradFileLayout make_grad_file_layout(const ParamLayout& layout, int grad_accum, DType dtype,
                                     int64_t max_piece) {
  MEMFIT_CHECK(dtype == DType::f32 || dtype == DType::bf16, "offload",
               "offloaded gradients are f32 or bf16, not {}", dtype_name(dtype));
  GradFileLayout g;
  g.dtype = dtype;
  g.grad_accum = grad_accum;
  g.units = unit_ranges(layout);
  uint64_t at = kHeaderBytes;
  for (const ElementRange& u : g.units) {
    g.file_offsets.push_back(at);
    at += unit_bytes(u, dtype);
  }
  g.file_bytes = at;
  g.edge_bytes = unit_bytes(g.units.front());
  g.tail_bytes = unit_bytes(g.units.back());
  for (size_t u = 1; u + 1 < g.units.size(); ++u)
    g.slot_bytes = std::max(g.slot_bytes, unit_bytes(g.units[u]));
  // With accumulation block l-1's read is in flight while block l computes and block l+1's
  // write drains: three slots. Without, nothing is read back: two.
  // bf16: each micro-batch computes from zero, so a slot is never read into; with accumulation
  // the sums so far come back into a buffer of their own (one block's, read while the block
  // computes: issued as its backward starts, added as it ends), and the edges' stay in RAM.
  g.block_slots = grad_accum > 1 && dtype == DType::f32 ? 3 : 2;
  if (dtype == DType::bf16 && grad_accum > 1) {
    g.edge_sums_bytes = unit_bytes(g.units.front(), dtype);
    g.tail_sums_bytes = unit_bytes(g.units.back(), dtype);
    for (size_t u = 1; u + 1 < g.units.size(); ++u)
      g.read_bytes = std::max(g.read_bytes, unit_bytes(g.units[u], dtype));
  }
  // A piece starts anywhere in its unit: its read is rounded out to pages, one more at most.
  int64_t largest = 0;
  for (const ElementRange& u : g.units) largest = std::max(largest, std::min(u.size(), max_piece));
  g.update_slot_bytes = align_up(static_cast<size_t>(largest) * dtype_size(dtype)) + kIoAlign;
  return g;
}

size_t GradFileLayout::unit_file_bytes(size_t unit) const { return unit_bytes(units[unit], dtype); }

uint64_t GradFileLayout::file_offset_of(int64_t e) const {
  const size_t u = unit_of(e);
  return file_offsets[u] + static_cast<uint64_t>(e - units[u].begin) * dtype_size(dtype);
}

size_t GradFileLayout::ram_bytes() const {
  const size_t backward = edge_bytes + tail_bytes + static_cast<size_t>(block_slots) * slot_bytes +
                          edge_sums_bytes + tail_sums_bytes + read_bytes;
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
  const uint64_t from = file_offset_of(piece.begin);
  const uint64_t start = from / kIoAlign * kIoAlign;
  return align_up(from + static_cast<uint64_t>(piece.size()) * dtype_size(dtype)) - start;
}

uint64_t GradFileLayout::backward_written() const {
  uint64_t b = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const bool edge = u == 0 || u + 1 == units.size();
    b += unit_file_bytes(u) * (edge ? 1 : static_cast<uint64_t>(grad_accum));
  }
  return b;
}

uint64_t GradFileLayout::backward_read() const {
  uint64_t b = 0;
  for (size_t u = 1; u + 1 < units.size(); ++u)
    b += unit_file_bytes(u) * static_cast<uint64_t>(grad_accum - 1);
  return b;
}

uint64_t GradFileLayout::io_bytes_per_step(const std::vector<ElementRange>& pieces) const {
  uint64_t b = backward_written() + backward_read();
  for (const ElementRange& p : pieces) b += piece_read_bytes(p);
  return b;
}

OffloadedGrads::OffloadedGrads(const ParamLayout& layout, MemoryPool& pool, const fs::path& dir,
                               const std::string& run, int grad_accum, DType dtype,
                               int64_t max_piece)
    : layout_(layout), fl_(make_grad_file_layout(layout, grad_accum, dtype, max_piece)) {
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
                           {"dtype", dtype == DType::bf16 ? "BF16" : "F32"},
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

Tensor OffloadedGrads::at(size_t offset, int64_t n, DType dtype) const {
  return buffer_.view_bytes(base_ + offset, {n}, dtype);
}

char* OffloadedGrads::block_buffer(int slot) const {
  return base() + fl_.edge_bytes + fl_.tail_bytes + static_cast<size_t>(slot) * fl_.slot_bytes;
}

char* OffloadedGrads::edge_sums_buffer() const {
  return block_buffer(fl_.block_slots);  // past the block slots
}

char* OffloadedGrads::read_buffer() const {
  return edge_sums_buffer() + fl_.edge_sums_bytes + fl_.tail_sums_bytes;
}

uint64_t OffloadedGrads::submit(IoRequest::Op op, size_t unit, char* buffer) {
  IoRequest r;
  r.op = op;
  r.fd = file_->fd();
  r.offset = fl_.file_offsets[unit];
  r.buffer = buffer;
  r.bytes = fl_.unit_file_bytes(unit);  // the padding past the unit is its own
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
  sums_read_.clear();
  slot_read_of_.assign(slot_read_of_.size(), -1);
  m_ = -1;
}

void OffloadedGrads::begin_micro_batch() {
  ++m_;
  MEMFIT_CHECK(m_ < fl_.grad_accum, "offload", "micro-batch {} of a step of {}", m_ + 1,
               fl_.grad_accum);
  // The edge units stay in RAM for the whole step: zeroed by its first micro-batch only, as
  // zero_grad zeroes the slab. (The update's ring, which shares the buffer, is done by now.)
  // bf16: every micro-batch computes its own sums from zero, as UnitGrads' do.
  if (m_ == 0 || bf16()) std::memset(base(), 0, fl_.edge_bytes + fl_.tail_bytes);
}

void OffloadedGrads::enter_backward(int layer) {
  const int S = fl_.block_slots;
  const int slot = layer % S;
  const size_t s = static_cast<size_t>(slot);
  const size_t unit = static_cast<size_t>(1 + layer);
  char* buf = block_buffer(slot);
  if (m_ == 0 || bf16()) {
    wait(slot_writes_[s]);  // block layer + S's write from this slot
    std::memset(buf, 0, fl_.slot_bytes);
    // bf16 after the first micro-batch: the sums so far, read while this block computes (the
    // last block's were added as its backward ended).
    if (m_ > 0) {
      MEMFIT_CHECK(sums_read_.empty(), "offload", "block {}'s sums read before block {}'s were added",
                   layer, layer + 1);
      sums_read_.push_back(submit(IoRequest::Op::read, unit, read_buffer()));
    }
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

uint16_t* OffloadedGrads::sum_bf16(size_t unit, char* buffer, const uint16_t* so_far) {
  // UnitGrads in one process (Note [Gradients in bf16]): the micro-batch's f32 sums rounded to
  // bf16 once; from the second micro-batch on added to the sums so far in f32 and rounded once.
  const int64_t n = fl_.units[unit].size();
  uint16_t* sums = pack_bf16(buffer, n);
  if (so_far) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i)
      sums[i] = bf16_from_f32(f32_from_bf16(so_far[i]) + f32_from_bf16(sums[i]));
  }
  // The update's check of the unit's final sums (update.cpp's check_bf16), unscaled in place.
  if (last()) {
    const kernels::UnscaleResult r = kernels::unscale_and_check_bf16(sums, n, inv_scale_);
    checks_[unit] = {r.finite, r.sum_squares};
  }
  return sums;
}

void OffloadedGrads::done(int part) {
  const int n_layer = static_cast<int>(fl_.units.size()) - 2;
  const bool edge = part == n_layer || part < 0;
  if (bf16()) {
    const size_t unit = part < 0 ? 0 : static_cast<size_t>(1 + part);
    if (edge) {
      // The edges' sums so far stay in RAM between micro-batches; the final ones are written.
      char* buf = part < 0 ? base() : base() + fl_.edge_bytes;
      uint16_t* so_far = reinterpret_cast<uint16_t*>(
          part < 0 ? edge_sums_buffer() : edge_sums_buffer() + fl_.edge_sums_bytes);
      const uint16_t* sums = sum_bf16(unit, buf, m_ > 0 ? so_far : nullptr);
      if (last())
        edge_writes_.push_back(submit(IoRequest::Op::write, unit, buf));
      else
        std::memcpy(so_far, sums, static_cast<size_t>(fl_.units[unit].size()) * 2);
    } else {
      const size_t s = static_cast<size_t>(part % fl_.block_slots);
      char* buf = block_buffer(static_cast<int>(s));
      if (m_ > 0) wait(sums_read_);
      sum_bf16(unit, buf, m_ > 0 ? reinterpret_cast<const uint16_t*>(read_buffer()) : nullptr);
      slot_writes_[s].push_back(submit(IoRequest::Op::write, unit, buf));
    }
  } else if (edge) {
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
  const uint64_t from = fl_.file_offset_of(piece.begin);
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
  const uint64_t from = fl_.file_offset_of(piece.begin);
  return at(static_cast<size_t>(slot) * fl_.update_slot_bytes + from % kIoAlign, piece.size(),
            fl_.dtype);
}

}  // namespace memfit::offload
