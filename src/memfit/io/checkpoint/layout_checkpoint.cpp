// Checkpoints of a split layout as whole tensors: see layout_checkpoint.h and Note [Checkpoints
// across layouts] in docs/notes/checkpoints.md.
#include "memfit/io/checkpoint/layout_checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/io/checkpoint/sharded_safetensors.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/io/hf/model_weights.h"
#include "memfit/model/layout_map.h"
#include "memfit/optim/state_runs.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const char* what, const fs::path& path, int err = errno) {
  MEMFIT_THROW(IoError, "checkpoint", "{} {} failed: {}", what, path.string(), std::strerror(err));
}

}  // namespace

// A file of the save opened for positioned writes; fsynced and closed by finish().
class PlacedFile {
 public:
  explicit PlacedFile(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail("opening", path_);
  }
  PlacedFile(const PlacedFile&) = delete;
  PlacedFile& operator=(const PlacedFile&) = delete;
  ~PlacedFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write_at(uint64_t offset, const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("writing", path_, w < 0 ? errno : EIO);
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
  }
  void finish() {
    if (::fsync(fd_) != 0) fail("fsync of", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing", path_);
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

namespace {

// A run of a stored matrix's rows [r0, r0 + nr) and columns [c0, c0 + nc), at `src` row-major
// with a row stride of nc: written transposed ((cols, rows) stored) tile by tile through the
// staging, one positioned write per column of a tile.
struct Rect {
  int64_t r0 = 0, nr = 0, c0 = 0, nc = 0;
  const std::byte* src = nullptr;
};

template <class E>
void write_transposed(PlacedFile& f, uint64_t at, int64_t rows, const Rect& r, E* staging,
                      int64_t staging_elems) {
  const int64_t R = std::max<int64_t>(1, std::min(r.nr, staging_elems));
  const int64_t C = std::max<int64_t>(1, std::min(r.nc, staging_elems / R));
  for (int64_t i0 = 0; i0 < r.nr; i0 += R) {
    const int64_t ni = std::min(R, r.nr - i0);
    for (int64_t j0 = 0; j0 < r.nc; j0 += C) {
      const int64_t nj = std::min(C, r.nc - j0);
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t j = 0; j < nj; ++j)
          std::memcpy(&staging[j * ni + i],
                      r.src + static_cast<size_t>((i0 + i) * r.nc + j0 + j) * sizeof(E), sizeof(E));
      for (int64_t j = 0; j < nj; ++j)
        f.write_at(at + static_cast<uint64_t>((r.c0 + j0 + j) * rows + r.r0 + i0) * sizeof(E),
                   &staging[j * ni], static_cast<size_t>(ni) * sizeof(E));
    }
  }
}

}  // namespace

LayoutFiles::LayoutFiles(const ModelConfig& whole, DType record, const Optimizer* optimizer,
                         uint64_t max_shard_bytes)
    : config_(whole), layout_(whole), record_(record) {
  MEMFIT_CHECK_DTYPE(record == DType::f32 || record == DType::bf16, "checkpoint",
                     "the weights of record are f32 or bf16, not {}", dtype_name(record));
  MEMFIT_CHECK(whole.tp == 1 && !whole.pipelined(), "checkpoint",
               "the files of a save are the whole model's (tp 1, every stage)");
  const size_t elem = dtype_size(record);
  // The weights: layout order, cut into shards as save_weights cuts them.
  const std::vector<ParamInfo>& params = layout_.params();
  std::vector<uint64_t> bytes;
  for (const ParamInfo& p : params) {
    int64_t n = 1;
    for (int64_t d : hf_param_shape(config_, p)) n *= d;
    stored_.push_back(n);
    bytes.push_back(static_cast<uint64_t>(n) * elem);
  }
  const std::vector<int> shard = plan_shards(bytes, max_shard_bytes);
  const int n_files = shard.empty() ? 1 : shard.back() + 1;
  params_.resize(params.size());
  // A file's header and each tensor's place, from the writer's own header (its order, its
  // padding): the bytes SafetensorsWriter::write gives the same tensors.
  auto lay_out = [&](SafetensorsWriter& w, const std::string& name,
                     const std::vector<std::pair<std::string, Place*>>& places) {
    File f{name, w.header_json(), w.file_size()};
    const json h = json::parse(f.header);
    f.header.resize((f.header.size() + 7) / 8 * 8, ' ');
    for (const auto& [tensor, place] : places) {
      place->file = static_cast<int>(files_.size());
      place->at = 8 + f.header.size() + h.at(tensor).at("data_offsets").at(0).get<uint64_t>();
    }
    files_.push_back(std::move(f));
  };
  json weight_map = json::object();
  uint64_t total = 0;
  for (int k = 0; k < n_files; ++k) {
    SafetensorsWriter w;
    std::vector<std::pair<std::string, Place*>> places;
    for (size_t i = 0; i < params.size(); ++i)
      if (n_files == 1 || shard[i] == k) {
        places.emplace_back(hf_param_name(config_, params[i]), &params_[i]);
        w.add_scattered(places.back().first, safetensors_dtype_of(record),
                        hf_param_shape(config_, params[i]));
      }
    w.set_metadata("format", "pt");  // as save_weights
    const std::string name =
        n_files == 1 ? std::string(kModelFile) : shard_file_name(k + 1, n_files);
    for (const auto& pl : places) weight_map[pl.first] = name;
    lay_out(w, name, places);
  }
  for (uint64_t b : bytes) total += b;
  if (n_files > 1)
    index_ = json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
  if (!optimizer) return;
  // optimizer.safetensors as save_optimizer_state writes it: the whole state tensors.
  SafetensorsWriter w;
  std::vector<std::pair<std::string, Place*>> places;
  const std::vector<StateSpec>& specs = optimizer->whole_state_specs();
  state_.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const StateSpec& s = specs[i];
    state_bytes_.push_back(dtype_size(s.dtype));
    places.emplace_back(optimizer_state_key(optimizer->name(), s.name), &state_[i]);
    w.add_scattered(places.back().first, safetensors_dtype_of(s.dtype), {s.numel});
  }
  w.set_metadata("format", "pt");
  w.set_metadata("optimizer", optimizer->name());
  w.set_metadata("steps_taken", std::to_string(optimizer->steps_taken()));
  lay_out(w, std::string(kOptimizerFile), places);
}

std::vector<std::string> LayoutFiles::files() const {
  std::vector<std::string> out;
  for (const File& f : files_) out.push_back(f.name);
  if (!index_.empty()) out.emplace_back(kModelIndexFile);
  return out;
}

void LayoutFiles::create(const fs::path& dir) const {
  for (const File& f : files_) {
    const fs::path path = dir / f.name;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) fail("creating", path);
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i)
      head[static_cast<size_t>(i)] = static_cast<char>(uint64_t(f.header.size()) >> (8 * i));
    head += f.header;
    const char* p = head.data();
    size_t n = head.size();
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : EIO;
        ::close(fd);
        fail("writing", path, err);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    if (::ftruncate(fd, static_cast<off_t>(f.size)) != 0) {
      const int err = errno;
      ::close(fd);
      fail("sizing", path, err);
    }
    if (::close(fd) != 0) fail("closing", path);
  }
  if (!index_.empty()) write_file_atomic(dir / kModelIndexFile, index_);
}

void LayoutFiles::move(const fs::path& from, const fs::path& to) const {
  for (const std::string& f : files()) fs::rename(from / f, to / f);
}

void LayoutFiles::write(const fs::path& dir, const std::vector<SliceRun>& runs, const void* record,
                        int64_t record_begin, const StateParts& state,
                        const Tensor& staging) const {
  MEMFIT_CHECK((state.data.empty() || state.data.size() == state_.size()) &&
                   state.runs.size() == state.data.size(),
               "checkpoint", "{} state tensors for a save of {}", state.data.size(),
               state_.size());
  Writer out(*this, dir, staging);
  out.weights(runs, record, record_begin);
  for (size_t s = 0; s < state.data.size(); ++s)
    if (state.data[s]) out.state(s, state.runs[s], state.data[s], 0);
  out.finish();
}

LayoutFiles::Writer::Writer(const LayoutFiles& files, fs::path dir, const Tensor& staging)
    : files_(files), dir_(std::move(dir)), staging_(staging) {}

LayoutFiles::Writer::~Writer() = default;

PlacedFile& LayoutFiles::Writer::file(int k) {
  auto& f = opened_[k];
  if (!f) f = std::make_unique<PlacedFile>(dir_ / files_.files_[static_cast<size_t>(k)].name);
  return *f;
}

void LayoutFiles::Writer::finish() {
  for (auto& [k, f] : opened_) f->finish();
  opened_.clear();
}

void LayoutFiles::Writer::weights(const std::vector<SliceRun>& runs, const void* record,
                                  int64_t record_begin) {
  const size_t elem = dtype_size(files_.record_);
  const std::vector<ParamInfo>& params = files_.layout_.params();
  const std::vector<Place>& places = files_.params_;
  const auto* rec = static_cast<const std::byte*>(record);
  const int64_t staging_elems =
      staging_.defined() ? static_cast<int64_t>(staging_.nbytes() / elem) : 0;
  // A transposed tensor's rectangles, merged while they continue one another (a row-parallel
  // slice is one run per row: its columns of every row, one rectangle).
  size_t rect_param = params.size();
  Rect rect;
  auto flush = [&] {
    if (rect_param == params.size() || rect.nr == 0) return;
    const ParamInfo& p = params[rect_param];
    MEMFIT_CHECK(staging_elems > 0, "checkpoint",
                 "a save of transposed tensors needs a staging buffer of at least one element");
    PlacedFile& f = file(places[rect_param].file);
    if (elem == 4)
      write_transposed(f, places[rect_param].at, p.shape[0], rect,
                       static_cast<uint32_t*>(staging_.raw_data()), staging_elems);
    else
      write_transposed(f, places[rect_param].at, p.shape[0], rect,
                       static_cast<uint16_t*>(staging_.raw_data()), staging_elems);
    rect = Rect{};
  };
  auto add_rect = [&](size_t i, const Rect& r) {
    const bool continues = rect_param == i && rect.nr > 0 && r.c0 == rect.c0 && r.nc == rect.nc &&
                           r.r0 == rect.r0 + rect.nr &&
                           r.src == rect.src + static_cast<size_t>(rect.nr * rect.nc) * elem;
    if (continues) {
      rect.nr += r.nr;
      return;
    }
    flush();
    rect_param = i;
    rect = r;
  };
  for (const SliceRun& run : runs) {
    if (run.whole < 0 || run.n == 0) continue;
    // The parameters the run's whole elements lie in (usually one).
    auto it = std::upper_bound(params.begin(), params.end(), run.whole,
                               [](int64_t x, const ParamInfo& p) { return x < p.offset; });
    size_t i = it == params.begin() ? 0 : static_cast<size_t>(it - params.begin()) - 1;
    for (; i < params.size() && params[i].offset < run.whole + run.n; ++i) {
      const ParamInfo& p = params[i];
      const int64_t a = std::max(run.whole, p.offset);
      const int64_t b = std::min(run.whole + run.n, p.offset + files_.stored_[i]);
      if (a >= b) continue;  // an alignment gap, or padding rows alone
      const std::byte* src =
          rec + static_cast<size_t>(run.local + (a - run.whole) - record_begin) * elem;
      if (!hf_param_transposed(files_.config_, p)) {
        file(places[i].file)
            .write_at(places[i].at + static_cast<uint64_t>(a - p.offset) * elem, src,
                      static_cast<size_t>(b - a) * elem);
        continue;
      }
      // (rows, cols) in memfit's layout: a partial first row, whole rows, a partial last row.
      const int64_t cols = p.shape[1];
      int64_t x = a - p.offset;
      const int64_t end = b - p.offset;
      while (x < end) {
        const int64_t row = x / cols, col = x % cols;
        Rect r;
        r.src = src + static_cast<size_t>(x - (a - p.offset)) * elem;
        if (col == 0 && end - x >= cols) {
          r.r0 = row;
          r.nr = (end - x) / cols;
          r.c0 = 0;
          r.nc = cols;
        } else {
          r.r0 = row;
          r.nr = 1;
          r.c0 = col;
          r.nc = std::min(cols - col, end - x);
        }
        add_rect(i, r);
        x += r.nr * r.nc;
      }
    }
  }
  flush();
}

// The state: the whole state tensors (state runs, optim/state_runs.h), each run straight to its
// place.
void LayoutFiles::Writer::state(size_t spec, const std::vector<SliceRun>& runs, const void* src,
                                int64_t begin) {
  MEMFIT_CHECK(spec < files_.state_.size(), "checkpoint", "state {} of a save of {}", spec,
               files_.state_.size());
  const auto* from = static_cast<const std::byte*>(src);
  const size_t es = files_.state_bytes_[spec];
  const Place& place = files_.state_[spec];
  for (const SliceRun& run : runs) {
    if (run.whole < 0 || run.n == 0) continue;
    file(place.file).write_at(place.at + static_cast<uint64_t>(run.whole) * es,
                              from + static_cast<size_t>(run.local - begin) * es,
                              static_cast<size_t>(run.n) * es);
  }
}

LayoutFiles::StateParts save_state_parts(const Optimizer& mine, const Optimizer& whole,
                                         const std::vector<SliceRun>& runs) {
  LayoutFiles::StateParts parts;
  parts.runs = state_layout_runs(mine, whole, runs, StateRunUse::save);
  const std::vector<ElementRange> extents = mine.state_extents(mine.range());
  const auto held = mine.state();
  const std::vector<StateSpec>& specs = mine.whole_state_specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const void* p = nullptr;
    for (const auto& [name, t] : held)
      if (name == specs[i].name) p = t.raw_data();
    parts.data.push_back(p);
    for (SliceRun& r : parts.runs[i]) {
      MEMFIT_CHECK(p && r.local >= extents[i].begin && r.local + r.n <= extents[i].end,
                   "checkpoint", "'{}' state '{}' [{}, {}) is outside the range's [{}, {})",
                   mine.name(), specs[i].name, r.local, r.local + r.n, extents[i].begin,
                   extents[i].end);
      r.local -= extents[i].begin;
    }
  }
  return parts;
}

LayoutStateReader::LayoutStateReader(const fs::path& dir, const Optimizer& optimizer,
                                     const Optimizer& whole_optimizer, std::vector<SliceRun> runs,
                                     ElementRange mine)
    : saved_(dir, whole_optimizer, whole_range(whole_optimizer.layout())),  // checked here
      runs_(state_layout_runs(optimizer, whole_optimizer, runs_within(runs, mine),
                              StateRunUse::load)) {
  const std::vector<StateSpec>& specs = optimizer.whole_state_specs();
  const std::vector<ElementRange> extents = optimizer.state_extents(mine);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const SliceRun& r : runs_[i])
      MEMFIT_CHECK(r.local >= extents[i].begin && r.local + r.n <= extents[i].end, "checkpoint",
                   "'{}' state '{}' [{}, {}) is outside the range's [{}, {})", optimizer.name(),
                   specs[i].name, r.local, r.local + r.n, extents[i].begin, extents[i].end);
    elem_bytes_.push_back(dtype_size(specs[i].dtype));
  }
}

void LayoutStateReader::read(size_t spec, ElementRange local, void* dst) const {
  auto* out = static_cast<std::byte*>(dst);
  const size_t es = elem_bytes_.at(spec);
  std::memset(out, 0, static_cast<size_t>(local.size()) * es);
  for (const SliceRun& r : runs_within(runs_.at(spec), local))
    saved_.read(spec, {r.whole, r.whole + r.n}, out + static_cast<size_t>(r.local - local.begin) * es);
}

void load_optimizer_state_by_layout(const fs::path& dir, Optimizer& optimizer,
                                    const Optimizer& whole_optimizer,
                                    const std::vector<SliceRun>& runs) {
  const ElementRange mine = optimizer.range();
  const LayoutStateReader saved(dir, optimizer, whole_optimizer, runs, mine);  // all checked
  const std::vector<StateSpec>& specs = optimizer.whole_state_specs();
  const std::vector<ElementRange> extents = optimizer.state_extents(mine);
  std::map<std::string, Tensor> tensors;
  for (auto& [n, t] : optimizer.state()) tensors.emplace(n, t);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto t = tensors.find(specs[i].name);
    if (t == tensors.end()) continue;  // an empty slice
    MEMFIT_CHECK(t->second.nbytes() >= static_cast<size_t>(extents[i].size()) *
                                           dtype_size(specs[i].dtype),
                 "checkpoint", "'{}' state '{}' holds {} bytes for [{}, {})", optimizer.name(),
                 specs[i].name, t->second.nbytes(), extents[i].begin, extents[i].end);
    std::memset(t->second.raw_data(), 0, t->second.nbytes());
    saved.read(i, extents[i], t->second.raw_data());
    saved.release(i);
  }
  optimizer.set_steps_taken(saved.steps_taken());
}

}  // namespace memfit::io
