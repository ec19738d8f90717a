// The streamed update and the streamed checkpoint (offloaded_optimizer.h).
#include "memfit/offload/offloaded_optimizer.h"

#include <chrono>
#include <charconv>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/layout_checkpoint.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/offload/offloaded_grads.h"

namespace memfit::offload {

namespace fs = std::filesystem;

OffloadedOptimizer::OffloadedOptimizer(const OptimConfig& config, const ParamLayout& layout,
                                       bool master, MemoryPool& pool, const fs::path& dir,
                                       const std::string& run, int64_t max_piece,
                                       std::optional<ElementRange> range)
    : params_(layout), master_(master) {
  const std::unique_ptr<Optimizer> whole = make_optimizer(config, layout, nullptr);
  // An optimizer over the range checks that it starts and ends where the state can be cut.
  if (range) make_optimizer(config, layout, nullptr, range);
  layout_ = make_offload_layout(layout, *whole, master, max_piece, range);
  MEMFIT_CHECK(!layout_.pieces.empty(), "offload", "nothing to offload in the range [{}, {})",
               layout_.range.begin, layout_.range.end);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    MEMFIT_THROW(IoError, "offload", "--offload-dir {}: cannot create the directory: {}",
                 dir.string(), ec ? ec.message() : "not a directory");
  // A disk too small is refused here, before any file or the ring exists.
  const uint64_t need = layout_.disk_total(), free = free_disk_bytes(dir);
  if (need > free)
    MEMFIT_THROW(IoError, "offload",
                 "--offload-dir {}: the offloaded {} needs {} bytes ({:.2f} GiB) of disk and the "
                 "filesystem has {} bytes ({:.2f} GiB) free",
                 dir.string(), master ? "master weights and optimizer state" : "optimizer state",
                 need, need / 1073741824.0, free, free / 1073741824.0);
  for (size_t u = 0; u < layout_.pieces.size(); ++u)
    units_.push_back(make_optimizer(config, layout, nullptr, layout_.pieces[u]));
  // An optimizer whose update needs scratch (APOLLO) gets one buffer in RAM for every piece,
  // which update one at a time (what the planner counts: optimizer_scratch_bytes).
  if (const int64_t n = whole->scratch_elements(); n > 0) {
    scratch_ = Tensor::empty(pool, {n}, DType::f32, Category::optimizer, "offload.scratch");
    for (auto& u : units_) u->set_scratch(scratch_);
  }
  io_ = make_io_engine();
  std::vector<int64_t> starts;
  for (const ElementRange& u : layout_.pieces) starts.push_back(u.begin);
  for (const OffloadTensor& t : layout_.tensors) {
    nlohmann::json header = {{"memfit_offload", 1},
                             {"run", run},
                             {"tensor", t.name},
                             {"dtype", std::string(dtype_name(t.dtype))},
                             {"numel", t.numel},
                             {"optimizer", whole->name()},
                             {"layout", {{"elements", layout.total()}, {"piece_starts", cut_points(starts)}}},
                             {"range", {layout_.range.begin, layout_.range.end}},
                             {"step", 0}};
    files_.push_back(std::make_unique<ScratchFile>(
        dir / fmt::format("{}.{}.offload", run, t.name), t.file_bytes, std::move(header)));
  }
  ring_ = Tensor::empty(pool, {static_cast<int64_t>(layout_.staging_bytes())}, DType::u8,
                        Category::staging, "offload.ring");
  const auto addr = reinterpret_cast<uintptr_t>(ring_.raw_data());
  ring_base_ = align_up(addr) - addr;
}

OffloadedOptimizer::~OffloadedOptimizer() {
  // No request may outlive the ring it reads into or writes from.
  try {
    if (io_) io_->wait_all();
  } catch (const std::exception&) {
  }
}

Tensor OffloadedOptimizer::slot_view(int slot, size_t tensor, size_t unit) const {
  const OffloadTensor& t = layout_.tensors[tensor];
  return ring_.view_bytes(ring_base_ + layout_.slot_offset(slot, tensor),
                          {t.extents[unit].size()}, t.dtype);
}

IoRequest OffloadedOptimizer::request(IoRequest::Op op, int slot, size_t tensor,
                                      size_t unit) const {
  const OffloadTensor& t = layout_.tensors[tensor];
  IoRequest r;
  r.op = op;
  r.fd = files_[tensor]->fd();
  r.offset = t.file_offsets[unit];
  r.buffer = static_cast<char*>(ring_.raw_data()) + ring_base_ + layout_.slot_offset(slot, tensor);
  r.bytes = align_up(t.extent_bytes(unit));  // the padding past the extent is the unit's own
  r.file = files_[tensor]->path().string();
  return r;
}

void OffloadedOptimizer::submit_unit(IoRequest::Op op, int slot, size_t unit,
                                     std::vector<uint64_t>& tickets) {
  for (size_t i = 0; i < layout_.tensors.size(); ++i) {
    IoRequest r = request(op, slot, i, unit);
    if (r.bytes == 0) continue;
    (op == IoRequest::Op::read ? stats_.bytes_read : stats_.bytes_written) += r.bytes;
    tickets.push_back(io_->submit(std::move(r)));
  }
}

void OffloadedOptimizer::wait(std::vector<uint64_t>& tickets, std::vector<IoWait>* log) {
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t t : tickets) io_->wait(t);
  const auto t1 = std::chrono::steady_clock::now();
  if (log && !tickets.empty()) log->push_back({t0, t1});
  tickets.clear();
  stats_.wait_seconds += std::chrono::duration<double>(t1 - t0).count();
}

CategoryBytes OffloadedOptimizer::file_bytes() const {
  CategoryBytes b{};
  for (size_t i = 0; i < files_.size(); ++i)
    b[static_cast<size_t>(layout_.tensors[i].category)] += std::filesystem::file_size(files_[i]->path());
  return b;
}

void OffloadedOptimizer::step(Tensor& working, const Tensor& grads, float lr, float grad_scale) {
  MEMFIT_CHECK(working.numel() == layout_.range.size(), "offload",
               "the weights ({}) must cover the range's {} elements", working.numel(),
               layout_.range.size());
  step_pieces(&working, nullptr, &grads, nullptr, lr, grad_scale);
}

void OffloadedOptimizer::step(WeightGather& working, const Tensor& grads, float lr,
                              float grad_scale) {
  MEMFIT_CHECK(working.from_file(), "offload", "the working weights are not in a file");
  step_pieces(nullptr, &working, &grads, nullptr, lr, grad_scale);
  working.end_update(steps_taken());
}

void OffloadedOptimizer::step(Tensor& working, OffloadedGrads& grads, float lr,
                              float grad_scale) {
  MEMFIT_CHECK(working.numel() == layout_.range.size(), "offload",
               "the weights ({}) must cover the range's {} elements", working.numel(),
               layout_.range.size());
  step_pieces(&working, nullptr, nullptr, &grads, lr, grad_scale);
}

void OffloadedOptimizer::step(WeightGather& working, OffloadedGrads& grads, float lr,
                              float grad_scale) {
  MEMFIT_CHECK(working.from_file(), "offload", "the working weights are not in a file");
  step_pieces(nullptr, &working, nullptr, &grads, lr, grad_scale);
  working.end_update(steps_taken());
}

void OffloadedOptimizer::step_pieces(Tensor* working, WeightGather* pieces, const Tensor* grads,
                                     OffloadedGrads* file, float lr, float grad_scale) {
  const auto start = std::chrono::steady_clock::now();
  const ElementRange& R = layout_.range;
  // Offloaded gradients are the whole layout's (one process).
  MEMFIT_CHECK(file ? R == whole_range(params_) : grads->numel() == R.size(), "offload",
               "the gradients ({}) must cover the range's [{}, {})",
               file ? "offloaded, the whole layout's" : std::to_string(grads->numel()), R.begin,
               R.end);
  const size_t n = layout_.pieces.size();
  const size_t first_state = master_ ? 1 : 0;
  // reads[s], writes[s]: the requests in flight for ring slot s.
  std::vector<uint64_t> reads[kRingSlots], writes[kRingSlots];
  std::vector<IoWait>* log = record_waits_ ? &waits_ : nullptr;
  // Offloaded gradients: a third stream, piece k's into the grads' own update slot k mod 3
  // (read-only: the slot is free once piece k is stepped).
  auto read = [&](int slot, size_t k) {
    submit_unit(IoRequest::Op::read, slot, k, reads[slot]);
    if (file) file->submit_piece(layout_.pieces[k], slot);
  };
  read(0, 0);
  if (n > 1) read(1, 1);
  for (size_t k = 0; k < n; ++k) {
    const int s = static_cast<int>(k % kRingSlots);
    wait(reads[s], log);
    const ElementRange& u = layout_.pieces[k];
    Optimizer& opt = *units_[k];
    std::vector<Tensor> state;
    for (size_t i = first_state; i < layout_.tensors.size(); ++i)
      state.push_back(u.size() && layout_.tensors[i].extents[k].size()
                          ? slot_view(s, i, k)
                          : Tensor{});
    opt.bind_state(std::move(state));
    // Offloaded working weights: read in first only where the update reads them (no master).
    Tensor w = pieces ? pieces->update_piece(u, !master_)
                      : working->view(u.begin - R.begin, {u.size()});
    const Tensor g = file ? file->wait_piece(u, s) : grads->view(u.begin - R.begin, {u.size()});
    if (master_) {
      Tensor m = slot_view(s, 0, k);
      opt.step_master(m, w, g, lr, grad_scale);
    } else {
      opt.step(w, g, lr, grad_scale);
    }
    if (pieces) pieces->update_piece_done(u);
    submit_unit(IoRequest::Op::write, s, k, writes[s]);
    // Unit k+2 goes into the slot unit k-1 was written from, once that write is done.
    if (k + 2 < n) {
      const int next = static_cast<int>((k + 2) % kRingSlots);
      wait(writes[next], log);
      read(next, k + 2);
    }
  }
  for (auto& w : writes) wait(w, log);
  for (auto& f : files_) f->set_step(steps_taken());
  stats_.update_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void OffloadedOptimizer::set_steps_taken(int64_t t) {
  for (auto& o : units_) o->set_steps_taken(t);
  for (auto& f : files_) f->set_step(t);
}

template <class F>
void OffloadedOptimizer::stream(size_t tensor, IoRequest::Op op, F&& f) {
  std::vector<uint64_t> tickets;
  for (size_t u = 0; u < layout_.pieces.size(); ++u) {
    const OffloadTensor& t = layout_.tensors[tensor];
    const size_t bytes = t.extent_bytes(u);
    if (bytes == 0) continue;
    IoRequest r = request(op, 0, tensor, u);
    char* buf = static_cast<char*>(r.buffer);
    if (op == IoRequest::Op::write) {
      f(u, buf, bytes);
      std::memset(buf + bytes, 0, r.bytes - bytes);
      stats_.bytes_written += r.bytes;
    } else {
      stats_.bytes_read += r.bytes;
    }
    tickets.push_back(io_->submit(std::move(r)));
    wait(tickets);
    if (op == IoRequest::Op::read) f(u, buf, bytes);
  }
}

void OffloadedOptimizer::write_master(const Tensor& slab) {
  const ElementRange& R = layout_.range;
  MEMFIT_CHECK(master_ && slab.dtype() == DType::f32 && slab.numel() == R.size(), "offload",
               "write_master takes an f32 slab of {} elements", R.size());
  const char* src = static_cast<const char*>(slab.raw_data());
  stream(0, IoRequest::Op::write, [&](size_t u, char* buf, size_t bytes) {
    std::memcpy(buf, src + (layout_.tensors[0].extents[u].begin - R.begin) * sizeof(float), bytes);
  });
}

void OffloadedOptimizer::read_master(Tensor& slab) {
  const ElementRange& R = layout_.range;
  MEMFIT_CHECK(master_ && slab.dtype() == DType::f32 && slab.numel() == R.size(), "offload",
               "read_master takes an f32 slab of {} elements", R.size());
  char* dst = static_cast<char*>(slab.raw_data());
  stream(0, IoRequest::Op::read, [&](size_t u, const char* buf, size_t bytes) {
    std::memcpy(dst + (layout_.tensors[0].extents[u].begin - R.begin) * sizeof(float), buf, bytes);
  });
}

void OffloadedOptimizer::write_master_from(
    const std::function<void(int64_t from, int64_t to, float* dst)>& fill) {
  MEMFIT_CHECK(master_, "offload", "write_master_from: this optimizer keeps no master weights");
  // Each unit filled into the next ring slot and written from it while the next unit is filled
  // (the set-up's draw overlaps its writes); a slot is reused once its write is done.
  const OffloadTensor& t = layout_.tensors[0];
  std::vector<uint64_t> writes[kRingSlots];
  int slot = 0;
  for (size_t u = 0; u < layout_.pieces.size(); ++u) {
    const size_t bytes = t.extent_bytes(u);
    if (bytes == 0) continue;
    wait(writes[slot]);
    IoRequest r = request(IoRequest::Op::write, slot, 0, u);
    char* buf = static_cast<char*>(r.buffer);
    const ElementRange& e = t.extents[u];
    MEMFIT_CHECK(static_cast<size_t>(e.size()) * sizeof(float) == bytes, "offload",
                 "master unit {}: {} bytes for {} elements", u, bytes, e.size());
    fill(e.begin, e.end, reinterpret_cast<float*>(buf));
    std::memset(buf + bytes, 0, r.bytes - bytes);
    stats_.bytes_written += r.bytes;
    writes[slot].push_back(io_->submit(std::move(r)));
    slot = (slot + 1) % kRingSlots;
  }
  for (auto& w : writes) wait(w);
}

void OffloadedOptimizer::read_master_to(
    const std::function<void(int64_t from, int64_t to, const float* src)>& take) {
  MEMFIT_CHECK(master_, "offload", "read_master_to: this optimizer keeps no master weights");
  stream(0, IoRequest::Op::read, [&](size_t u, const char* buf, size_t) {
    const ElementRange& e = layout_.tensors[0].extents[u];
    take(e.begin, e.end, reinterpret_cast<const float*>(buf));
  });
}

void OffloadedOptimizer::read_master_range(
    ElementRange want,
    const std::function<void(int64_t from, int64_t to, const float* src)>& take) {
  MEMFIT_CHECK(master_, "offload", "read_master_range: this optimizer keeps no master weights");
  const OffloadTensor& t = layout_.tensors[0];
  std::vector<size_t> pieces;  // those that overlap `want`
  for (size_t u = 0; u < layout_.pieces.size(); ++u)
    if (!t.extents[u].intersect(want).empty()) pieces.push_back(u);
  // Piece k in slot k mod 2: piece k + 1's read is issued before piece k is handed over.
  std::vector<uint64_t> in_flight[2];
  auto issue = [&](size_t k) {
    IoRequest r = request(IoRequest::Op::read, static_cast<int>(k % 2), 0, pieces[k]);
    stats_.bytes_read += r.bytes;
    in_flight[k % 2].push_back(io_->submit(std::move(r)));
  };
  if (!pieces.empty()) issue(0);
  try {
    for (size_t k = 0; k < pieces.size(); ++k) {
      wait(in_flight[k % 2]);
      if (k + 1 < pieces.size()) issue(k + 1);
      const ElementRange& e = t.extents[pieces[k]];
      const ElementRange part = e.intersect(want);
      const auto* buf = reinterpret_cast<const float*>(
          static_cast<const char*>(ring_.raw_data()) + ring_base_ +
          layout_.slot_offset(static_cast<int>(k % 2), 0));
      take(part.begin, part.end, buf + (part.begin - e.begin));
    }
  } catch (...) {
    // No read may land in the ring behind an unwinding caller (a failed one is already
    // reported by what is unwinding).
    try {
      io_->wait_all();
    } catch (...) {
    }
    throw;
  }
}

void OffloadedOptimizer::save_state(const fs::path& file) {
  MEMFIT_CHECK(layout_.range == whole_range(params_), "offload",
               "save_state saves the whole layout's state; this optimizer has [{}, {})",
               layout_.range.begin, layout_.range.end);
  io::SafetensorsWriter writer;
  for (size_t i = master_ ? 1 : 0; i < layout_.tensors.size(); ++i) {
    const OffloadTensor& t = layout_.tensors[i];
    if (t.numel == 0) continue;  // as Optimizer::state() leaves out an empty tensor
    writer.add_source(io::optimizer_state_key(name(), t.name), io::safetensors_dtype_of(t.dtype),
                      {t.numel}, [this, i](const io::SafetensorsWriter::ByteSink& sink) {
                        stream(i, IoRequest::Op::read,
                               [&](size_t, const char* buf, size_t bytes) { sink(buf, bytes); });
                      });
  }
  writer.set_metadata("format", "pt");
  writer.set_metadata("optimizer", name());
  writer.set_metadata("steps_taken", std::to_string(steps_taken()));
  writer.write(file);
}

void OffloadedOptimizer::load_state(const fs::path& file) {
  MEMFIT_CHECK(layout_.range == whole_range(params_), "offload",
               "load_state loads the whole layout's state; this optimizer has [{}, {})",
               layout_.range.begin, layout_.range.end);
  io::SafetensorsReader reader(file);
  const std::string where = file.string();
  auto meta = [&](const char* key) -> const std::string& {
    auto it = reader.metadata().find(key);
    if (it == reader.metadata().end())
      MEMFIT_THROW(IoError, "checkpoint", "{}: metadata has no \"{}\"", where, key);
    return it->second;
  };
  if (meta("optimizer") != name())
    MEMFIT_THROW(IoError, "checkpoint", "{}: holds '{}' optimizer state; this run uses '{}'",
                 where, meta("optimizer"), name());
  int64_t steps = 0;
  const std::string& text = meta("steps_taken");
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), steps);
  if (ec != std::errc() || end != text.data() + text.size() || steps < 0)
    MEMFIT_THROW(IoError, "checkpoint", "{}: steps_taken '{}' is not a non-negative integer",
                 where, text);
  // Everything checked before a byte is written.
  std::vector<std::string> mismatches;
  std::map<std::string, bool> used;
  for (const io::SafetensorsEntry& e : reader.entries()) used[e.name] = false;
  std::vector<std::pair<size_t, const io::SafetensorsEntry*>> copies;
  for (size_t i = master_ ? 1 : 0; i < layout_.tensors.size(); ++i) {
    const OffloadTensor& t = layout_.tensors[i];
    if (t.numel == 0) continue;
    const std::string key = io::optimizer_state_key(name(), t.name);
    const io::SafetensorsEntry* e = reader.find(key);
    const io::SafetensorsDType type = io::safetensors_dtype_of(t.dtype);
    if (!e) {
      mismatches.push_back(fmt::format("missing '{}' {} ({})", key,
                                       io::safetensors_dtype_name(type), t.numel));
      continue;
    }
    used[key] = true;
    if (e->shape != std::vector<int64_t>{t.numel} || e->dtype != type) {
      mismatches.push_back(fmt::format("'{}' is {} {}, expected {} ({})", key,
                                       io::safetensors_dtype_name(e->dtype),
                                       io::format_shape(e->shape),
                                       io::safetensors_dtype_name(type), t.numel));
      continue;
    }
    copies.emplace_back(i, e);
  }
  for (auto& [n, u] : used)
    if (!u) mismatches.push_back(fmt::format("unexpected '{}'", n));
  if (!mismatches.empty()) {
    std::string list;
    for (const std::string& m : mismatches) list += (list.empty() ? "" : "; ") + m;
    MEMFIT_THROW(IoError, "checkpoint",
                 "{}: the optimizer state does not match this '{}' optimizer: {}", where, name(),
                 list);
  }
  for (auto& [i, e] : copies) {
    const std::byte* src = reader.bytes(*e);
    const size_t elem = dtype_size(layout_.tensors[i].dtype);
    stream(i, IoRequest::Op::write, [&](size_t u, char* buf, size_t bytes) {
      const uint64_t at = layout_.tensors[i].extents[u].begin * elem;
      std::memcpy(buf, src + at, bytes);
      reader.release_before(*e, at + bytes);  // copied: its pages leave RAM as the load goes
    });
    reader.release(*e);
  }
  set_steps_taken(steps);
}

void OffloadedOptimizer::save_shard(const fs::path& file, const Tensor& weights) {
  save_shard(file, weights, nullptr);
}

void OffloadedOptimizer::save_shard(const fs::path& file, WeightGather& working) {
  MEMFIT_CHECK(!master_ && working.from_file(), "offload",
               "save_shard from offloaded working weights: they are the weights of record only "
               "without master weights");
  save_shard(file, Tensor{}, &working);
}

void OffloadedOptimizer::save_shard(const fs::path& file, const Tensor& weights,
                                    WeightGather* working) {
  const ElementRange& R = layout_.range;
  MEMFIT_CHECK(master_ || working || weights.numel() == R.size(), "offload",
               "a shard's weights ({} elements) must cover the offloaded range's {}",
               weights.numel(), R.size());
  const size_t first_state = master_ ? 1 : 0;
  const std::vector<ElementRange> mine = descriptor().state_extents(R);
  io::SafetensorsWriter writer;
  if (master_) {
    MEMFIT_CHECK(!weights.defined(), "offload",
                 "save_shard: the weights of record are the master file's (pass none)");
    // The master weights, a unit at a time from their file (as save_state streams the state).
    if (R.size() > 0)
      writer.add_source(std::string(io::kZeroWeightsKey), io::SafetensorsDType::F32, {R.size()},
                        [this](const io::SafetensorsWriter::ByteSink& sink) {
                          stream(0, IoRequest::Op::read,
                                 [&](size_t, const char* buf, size_t bytes) { sink(buf, bytes); });
                        });
  } else if (working) {
    // The working weights of record, a unit's part at a time from RAM or their file.
    if (R.size() > 0)
      writer.add_source(std::string(io::kZeroWeightsKey),
                        io::safetensors_dtype_of(working->dtype()), {R.size()},
                        [working](const io::SafetensorsWriter::ByteSink& sink) {
                          working->read_mine(
                              [&](const char* buf, size_t bytes) { sink(buf, bytes); });
                        });
  } else if (weights.numel() > 0) {
    writer.add(std::string(io::kZeroWeightsKey), weights);
  }
  for (size_t i = first_state; i < layout_.tensors.size(); ++i) {
    const OffloadTensor& t = layout_.tensors[i];
    const int64_t n = mine[i - first_state].size();
    if (n == 0) continue;  // as Optimizer::state() leaves out an empty tensor
    writer.add_source(io::optimizer_state_key(name(), t.name), io::safetensors_dtype_of(t.dtype),
                      {n}, [this, i](const io::SafetensorsWriter::ByteSink& sink) {
                        stream(i, IoRequest::Op::read,
                               [&](size_t, const char* buf, size_t bytes) { sink(buf, bytes); });
                      });
  }
  io::set_zero_shard_metadata(writer, name(), steps_taken(), R);
  writer.write(file);
}

template <class Saved>
void OffloadedOptimizer::load_state_pieces(const Saved& saved) {
  const size_t first_state = master_ ? 1 : 0;
  for (size_t i = first_state; i < layout_.tensors.size(); ++i) {
    const OffloadTensor& t = layout_.tensors[i];
    stream(i, IoRequest::Op::write, [&](size_t u, char* buf, size_t) {
      saved.read(i - first_state, t.extents[u], buf);
    });
    saved.release(i - first_state);
  }
  set_steps_taken(saved.steps_taken());
}

void OffloadedOptimizer::load_state(const io::SavedOptimizerState& saved) {
  load_state_pieces(saved);
}

void OffloadedOptimizer::load_state(const io::LayoutStateReader& saved) {
  load_state_pieces(saved);
}

void OffloadedOptimizer::read_state_to(
    size_t spec, const std::function<void(int64_t from, int64_t to, const void* src)>& take) {
  const size_t i = spec + (master_ ? 1 : 0);
  MEMFIT_CHECK(i < layout_.tensors.size(), "offload", "state {} of {}", spec,
               layout_.tensors.size() - (master_ ? 1 : 0));
  stream(i, IoRequest::Op::read, [&](size_t u, const char* buf, size_t) {
    const ElementRange& e = layout_.tensors[i].extents[u];
    take(e.begin, e.end, buf);
  });
}

}  // namespace memfit::offload
