// The working weights' file (param_file.h).
#include "memfit/offload/param_file.h"

#include <chrono>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/state/shard.h"

namespace memfit::offload {

namespace fs = std::filesystem;

ParamFileLayout make_param_file_layout(const ParamLayout& layout, DType dtype,
                                       int64_t persist_threshold,
                                       std::optional<ElementRange> range) {
  const GatherUnits g = gather_units(layout, persist_threshold);
  ParamFileLayout L;
  L.dtype = dtype;
  L.range = range.value_or(whole_range(layout));
  L.units = g.units;
  uint64_t at = kHeaderBytes;
  for (size_t u = 0; u < g.units.size(); ++u) {
    L.parts.push_back(g.units[u].intersect(L.range));
    const bool in_file = !g.persistent[u] && !L.parts.back().empty();
    L.offsets.push_back(in_file ? static_cast<int64_t>(at) : -1);
    if (in_file) at += L.request_bytes(u);
  }
  L.file_bytes = at;
  return L;
}

uint64_t ParamFileLayout::request_bytes(size_t u) const {
  return align_up(static_cast<size_t>(parts[u].size()) * dtype_size(dtype));
}

uint64_t ParamFileLayout::blocks_bytes() const {
  uint64_t b = 0;
  for (size_t u = 0; u < units.size(); ++u)
    if (in_file(u)) b += request_bytes(u);
  return b;
}

ParamIoBytes param_io_bytes_per_step(const ParamLayout& layout, DType dtype,
                                     const std::vector<Phase>& phases, int micro_batches,
                                     int64_t persist_threshold, ParamUpdateIo update,
                                     std::optional<ElementRange> range, bool in_backward) {
  const ParamFileLayout L = make_param_file_layout(layout, dtype, persist_threshold, range);
  ParamIoBytes io;
  for (int u : gather_events(gather_units(layout, persist_threshold), phases))
    if (L.in_file(static_cast<size_t>(u))) io.read += L.request_bytes(static_cast<size_t>(u));
  io.read *= static_cast<uint64_t>(micro_batches);
  switch (update) {
    case ParamUpdateIo::read_write:
      if (!in_backward) io.read += L.blocks_bytes();  // else stepped in the slot it was read into
      [[fallthrough]];
    case ParamUpdateIo::write: io.written = L.blocks_bytes(); break;
    case ParamUpdateIo::none: break;
  }
  return io;
}

ParamFile::ParamFile(const ParamLayout& layout, DType dtype, int64_t persist_threshold,
                     const fs::path& dir, const std::string& run,
                     std::optional<ElementRange> range)
    : layout_(make_param_file_layout(layout, dtype, persist_threshold, range)) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    MEMFIT_THROW(IoError, "offload", "--offload-dir {}: cannot create the directory: {}",
                 dir.string(), ec ? ec.message() : "not a directory");
  const uint64_t need = layout_.file_bytes, free = free_disk_bytes(dir);
  if (need > free)
    MEMFIT_THROW(IoError, "offload",
                 "--offload-dir {}: the offloaded working weights (--offload-params nvme) need "
                 "{} bytes ({:.2f} GiB) of disk and the filesystem has {} bytes ({:.2f} GiB) "
                 "free",
                 dir.string(), need, need / 1073741824.0, free, free / 1073741824.0);
  io_ = make_io_engine();
  std::vector<int64_t> starts;
  for (size_t u = 0; u < layout_.units.size(); ++u)
    if (layout_.in_file(u)) starts.push_back(layout_.parts[u].begin);
  nlohmann::json header = {{"memfit_offload", 1},
                           {"run", run},
                           {"tensor", "params"},
                           {"dtype", std::string(dtype_name(dtype))},
                           {"numel", layout.total()},
                           {"layout",
                            {{"elements", layout.total()},
                             {"persist_threshold", persist_threshold},
                             {"block_starts", cut_points(starts)}}},
                           {"range", {layout_.range.begin, layout_.range.end}},
                           {"step", 0}};
  file_ = std::make_unique<ScratchFile>(dir / fmt::format("{}.params.offload", run),
                                        layout_.file_bytes, std::move(header));
}

ParamFile::~ParamFile() {
  // No request may outlive the ring it reads into or writes from (the ring is the model's,
  // destroyed after this file: the trainer makes the file first).
  try {
    if (io_) io_->wait_all();
  } catch (const std::exception&) {
  }
}

IoRequest ParamFile::request(IoRequest::Op op, size_t unit, void* buf) const {
  MEMFIT_CHECK(unit < layout_.units.size() && layout_.in_file(unit), "offload",
               "unit {} of the working weights is not in the file", unit);
  IoRequest r;
  r.op = op;
  r.fd = file_->fd();
  r.offset = static_cast<uint64_t>(layout_.offsets[unit]);
  r.buffer = buf;
  r.bytes = layout_.request_bytes(unit);
  r.file = file_->path().string();
  return r;
}

uint64_t ParamFile::read(size_t unit, void* dst) {
  IoRequest r = request(IoRequest::Op::read, unit, dst);
  read_ += r.bytes;
  return io_->submit(std::move(r));
}

uint64_t ParamFile::write(size_t unit, const void* src) {
  IoRequest r = request(IoRequest::Op::write, unit, const_cast<void*>(src));
  written_ += r.bytes;
  return io_->submit(std::move(r));
}

void ParamFile::wait(uint64_t ticket) {
  const auto t0 = std::chrono::steady_clock::now();
  io_->wait(ticket);
  const auto t1 = std::chrono::steady_clock::now();
  wait_s_ += std::chrono::duration<double>(t1 - t0).count();
  if (record_waits_) waits_.push_back({t0, t1});
}

}  // namespace memfit::offload
