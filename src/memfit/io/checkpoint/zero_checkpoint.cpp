// ZeRO's sharded checkpoint state: the shard files, their index, and resharding on load.
// See "ZeRO's sharded optimizer state" in docs/notes/checkpoints.md.
#include "memfit/io/checkpoint/zero_checkpoint.h"

#include <charconv>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/hf/model_hf_config.h"
#include "memfit/io/checkpoint/safetensors.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::string zero_shard_file(int rank, int world) {
  return fmt::format("zero-rank-{:05d}-of-{:05d}.safetensors", rank, world);
}

void set_zero_shard_metadata(SafetensorsWriter& writer, const std::string& optimizer,
                             int64_t steps_taken, const ElementRange& range) {
  writer.set_metadata("format", "pt");
  writer.set_metadata("optimizer", optimizer);
  writer.set_metadata("steps_taken", std::to_string(steps_taken));
  writer.set_metadata("begin", std::to_string(range.begin));
  writer.set_metadata("end", std::to_string(range.end));
}

void save_zero_shard(const fs::path& file, const Optimizer& optimizer, const Tensor& weights) {
  MEMFIT_CHECK(weights.numel() == optimizer.range().size(), "checkpoint",
               "a shard's weights ({} elements) must cover its optimizer's range ({})",
               weights.numel(), optimizer.range().size());
  SafetensorsWriter writer;
  if (weights.numel() > 0) writer.add(std::string(kZeroWeightsKey), weights);
  for (auto& [n, t] : optimizer.state()) writer.add(optimizer_state_key(optimizer.name(), n), t);
  set_zero_shard_metadata(writer, optimizer.name(), optimizer.steps_taken(), optimizer.range());
  writer.write(file);
}

std::string zero_index_json(const Optimizer& optimizer, const StatePlacement& placement) {
  const std::vector<ElementRange>& shards = placement.shards();
  json state = json::array();
  for (const StateSpec& s : optimizer.whole_state_specs())
    state.push_back({{"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"numel", s.numel}});
  json ranks = json::array();
  const int world = static_cast<int>(shards.size());
  for (int r = 0; r < world; ++r) {
    const ElementRange& range = shards[static_cast<size_t>(r)];
    json extents = json::array();
    for (const ElementRange& e : optimizer.state_extents(range))
      extents.push_back({e.begin, e.end});
    ranks.push_back({{"file", zero_shard_file(r, world)},
                     {"begin", range.begin},
                     {"end", range.end},
                     {"state_extents", extents}});
  }
  const json j = {{"format", "memfit-zero-shards"},
                  {"world_size", world},
                  {"zero", placement.stage()},
                  {"optimizer", optimizer.name()},
                  {"steps_taken", optimizer.steps_taken()},
                  {"layout_total", optimizer.layout().total()},
                  {"state", state},
                  {"shards", ranks}};
  return j.dump(2) + "\n";
}

bool has_zero_shards(const fs::path& dir) { return fs::exists(dir / kZeroIndexFile); }

namespace {

// One saved shard: its file and where its state lies in each whole state tensor.
struct OldShard {
  fs::path file;
  std::vector<ElementRange> extents;  // per whole state spec
};

struct SavedState {
  std::string optimizer;
  int64_t steps = 0;
  std::vector<OldShard> shards;
};

SavedState read_index(const fs::path& path, const Optimizer& opt) {
  const std::string where = path.string();
  json j;
  try {
    j = json::parse(read_file_to_string(path));
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "checkpoint", "{}: not valid JSON: {}", where, e.what());
  }
  SavedState s;
  try {
    s.optimizer = j.at("optimizer").get<std::string>();
    s.steps = j.at("steps_taken").get<int64_t>();
    if (s.optimizer != opt.name())
      MEMFIT_THROW(IoError, "checkpoint", "{}: holds '{}' optimizer state; this run uses '{}'",
                   where, s.optimizer, opt.name());
    const int64_t total = j.at("layout_total").get<int64_t>();
    if (total != opt.layout().total())
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: layout_total {} elements, this model's layout has {}", where, total,
                   opt.layout().total());
    const auto& want = opt.whole_state_specs();
    const json& state = j.at("state");
    std::vector<std::string> diffs;
    for (size_t i = 0; i < std::max(want.size(), state.size()); ++i) {
      const std::string saved =
          i < state.size() ? fmt::format("{} {} {}", state[i].at("name").get<std::string>(),
                                         state[i].at("dtype").get<std::string>(),
                                         state[i].at("numel").get<int64_t>())
                           : "(none)";
      const std::string mine =
          i < want.size()
              ? fmt::format("{} {} {}", want[i].name, dtype_name(want[i].dtype), want[i].numel)
              : "(none)";
      if (saved != mine)
        diffs.push_back(fmt::format("state {}: saved {}, expected {}", i, saved, mine));
    }
    if (!diffs.empty())
      MEMFIT_THROW(IoError, "checkpoint", "{}: the optimizer state does not match this '{}': {}",
                   where, opt.name(), fmt::join(diffs, "; "));
    for (const json& r : j.at("shards")) {
      OldShard o;
      const std::string file = r.at("file").get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        MEMFIT_THROW(IoError, "checkpoint", "{}: shard file '{}' is not a plain file name", where,
                     file);
      o.file = path.parent_path() / file;
      for (const json& e : r.at("state_extents"))
        o.extents.push_back({e.at(0).get<int64_t>(), e.at(1).get<int64_t>()});
      if (o.extents.size() != want.size())
        MEMFIT_THROW(IoError, "checkpoint", "{}: shard {} has {} state extents, expected {}", where,
                     file, o.extents.size(), want.size());
      s.shards.push_back(std::move(o));
    }
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "checkpoint", "{}: {}", where, e.what());
  }
  return s;
}

int64_t parse_steps(const SafetensorsReader& reader) {
  auto it = reader.metadata().find("steps_taken");
  int64_t steps = -1;
  if (it != reader.metadata().end()) {
    const std::string& v = it->second;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), steps);
    if (ec != std::errc() || end != v.data() + v.size()) steps = -1;
  }
  if (steps < 0)
    MEMFIT_THROW(IoError, "checkpoint",
                 "{}: metadata \"steps_taken\" missing or not a "
                 "non-negative integer",
                 reader.path().string());
  return steps;
}

}  // namespace

SavedOptimizerState::SavedOptimizerState(const fs::path& dir, const Optimizer& opt,
                                         const ElementRange& range) {
  const fs::path whole = dir / kOptimizerFile;
  SavedState saved;
  if (has_zero_shards(dir)) {
    saved = read_index(dir / kZeroIndexFile, opt);
  } else {
    if (!fs::exists(whole))
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: neither {} nor {}, so the optimizer cannot resume (load the weights alone "
                   "with --init-from to start a fresh optimizer)",
                   dir.string(), kOptimizerFile, kZeroIndexFile);
    // A whole-layout state: one shard whose extents are every whole tensor.
    OldShard o{whole, {}};
    for (const StateSpec& s : opt.whole_state_specs()) o.extents.push_back({0, s.numel});
    saved.shards.push_back(std::move(o));
  }

  const auto& specs = opt.whole_state_specs();
  mine_ = opt.state_extents(range);
  sources_.resize(specs.size());
  std::vector<std::string> problems;
  steps_ = saved.steps;
  bool steps_known = has_zero_shards(dir);
  for (const OldShard& o : saved.shards) {
    bool overlaps = false;
    for (size_t i = 0; i < specs.size(); ++i)
      overlaps = overlaps || !mine_[i].intersect(o.extents[i]).empty();
    if (!overlaps && steps_known) continue;
    if (!fs::exists(o.file)) {
      problems.push_back(fmt::format("{} is missing", o.file.string()));
      continue;
    }
    readers_.push_back(std::make_unique<SafetensorsReader>(o.file));
    const SafetensorsReader& reader = *readers_.back();
    auto name = reader.metadata().find("optimizer");
    if (name == reader.metadata().end() || name->second != opt.name())
      problems.push_back(
          fmt::format("{} holds '{}' optimizer state; this run uses '{}'", o.file.string(),
                      name == reader.metadata().end() ? "" : name->second, opt.name()));
    const int64_t file_steps = parse_steps(reader);
    if (!steps_known) {
      steps_ = file_steps;
      steps_known = true;
    } else if (file_steps != steps_) {
      problems.push_back(
          fmt::format("{}: steps_taken {}, the index says {}", o.file.string(), file_steps, steps_));
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      if (mine_[i].intersect(o.extents[i]).empty()) continue;
      const std::string key = optimizer_state_key(opt.name(), specs[i].name);
      const SafetensorsEntry* e = reader.find(key);
      const SafetensorsDType type = safetensors_dtype_of(specs[i].dtype);
      if (!e || e->dtype != type || e->numel() != o.extents[i].size()) {
        problems.push_back(fmt::format(
            "{}: '{}' is {}, expected {} of {} elements", o.file.string(), key,
            e ? fmt::format("{} {}", safetensors_dtype_name(e->dtype), format_shape(e->shape))
              : "missing",
            safetensors_dtype_name(type), o.extents[i].size()));
        continue;
      }
      sources_[i].push_back({o.extents[i], &reader, e, dtype_size(specs[i].dtype)});
    }
  }
  // The saved shards' extents tile each whole tensor, so the parts of this range's extents
  // they hold must add up to it exactly.
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t covered = 0;
    for (const OldShard& o : saved.shards) covered += mine_[i].intersect(o.extents[i]).size();
    if (covered != mine_[i].size())
      problems.push_back(fmt::format("state '{}': the shards hold {} of this range's {} elements",
                                     specs[i].name, covered, mine_[i].size()));
  }
  if (!problems.empty())
    MEMFIT_THROW(IoError, "checkpoint", "{}: the optimizer state cannot be loaded: {}",
                 dir.string(), fmt::join(problems, "; "));
}

SavedOptimizerState::~SavedOptimizerState() = default;

void SavedOptimizerState::read(size_t spec, const ElementRange& elements, void* dst) const {
  MEMFIT_CHECK(mine_.at(spec).contains(elements), "checkpoint",
               "state {}: elements [{}, {}) outside the opened extent [{}, {})", spec,
               elements.begin, elements.end, mine_[spec].begin, mine_[spec].end);
  for (const Source& s : sources_.at(spec)) {
    const ElementRange part = elements.intersect(s.extent);
    if (part.empty()) continue;
    const uint64_t at = (part.begin - s.extent.begin) * s.elem_bytes,
                   n = static_cast<uint64_t>(part.size()) * s.elem_bytes;
    std::memcpy(static_cast<std::byte*>(dst) + (part.begin - elements.begin) * s.elem_bytes,
                s.reader->bytes(*s.entry) + at, n);
    s.reader->release_before(*s.entry, at + n);  // copied: the file's pages leave RAM
  }
}

void SavedOptimizerState::release(size_t spec) const {
  for (const Source& s : sources_.at(spec)) s.reader->release(*s.entry);
}

void load_optimizer_state_any(const fs::path& dir, Optimizer& opt) {
  if (!has_zero_shards(dir) && opt.range() == whole_range(opt.layout()) &&
      fs::exists(dir / kOptimizerFile)) {
    load_optimizer_state(dir / kOptimizerFile, opt);  // the exact, whole-file check
    return;
  }
  const SavedOptimizerState saved(dir, opt, opt.range());  // everything checked here
  const auto& specs = opt.whole_state_specs();
  std::map<std::string, Tensor> tensors;
  for (auto& [n, t] : opt.state()) tensors.emplace(n, t);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (saved.extent(i).empty()) continue;
    saved.read(i, saved.extent(i), tensors.at(specs[i].name).raw_data());
    saved.release(i);
  }
  opt.set_steps_taken(saved.steps_taken());
}

namespace {

json read_zero_index(const fs::path& index) {
  try {
    return json::parse(read_file_to_string(index));
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "checkpoint", "{}: not valid JSON: {}", index.string(), e.what());
  }
}

// open_zero_weights_source, given the index as parsed (`j`) and config.json as read.
std::unique_ptr<ParamSource> zero_weights_source(const fs::path& dir, const json& j,
                                                 const ModelConfig& config) {
  const fs::path index = dir / kZeroIndexFile;
  std::vector<SlabPiece> pieces;
  std::optional<DType> dtype;
  try {
    for (const json& r : j.at("shards")) {
      const int64_t begin = r.at("begin").get<int64_t>(), end = r.at("end").get<int64_t>();
      if (end == begin) continue;  // a rank with nothing
      const std::string file = r.at("file").get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        MEMFIT_THROW(IoError, "checkpoint", "{}: shard file '{}' is not a plain file name",
                     index.string(), file);
      if (!fs::exists(dir / file))
        MEMFIT_THROW(IoError, "checkpoint",
                     "{}: {} is missing (a sharded save's weights are its shard files' ranges)",
                     index.string(), (dir / file).string());
      auto reader = std::make_shared<SafetensorsReader>(dir / file);
      const SafetensorsEntry& e = reader->at(kZeroWeightsKey);
      const std::optional<DType> t = memfit_dtype_of(e.dtype);
      if (!t || e.numel() != end - begin || (dtype && *t != *dtype))
        MEMFIT_THROW(IoError, "checkpoint",
                     "{}: '{}' is {} {}, expected {} elements of the weights' type",
                     (dir / file).string(), kZeroWeightsKey, safetensors_dtype_name(e.dtype),
                     format_shape(e.shape), end - begin);
      dtype = t;
      const size_t es = dtype_size(*t);
      pieces.push_back({begin, end, [reader, &e, begin, es](int64_t from, int64_t to, void* dst) {
                          const uint64_t at = (from - begin) * es, n = (to - from) * es;
                          std::memcpy(dst, reader->bytes(e) + at, n);
                          reader->release_before(e, at + n);  // copied: its pages leave RAM
                        }});
    }
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "checkpoint", "{}: {}", index.string(), e.what());
  }
  if (!dtype) MEMFIT_THROW(IoError, "checkpoint", "{}: no shard holds weights", index.string());
  return make_slab_pieces_source(
      config, *dtype, std::move(pieces),
      fmt::format("checkpoint {} ({} shard files)", dir.string(), pieces.size()));
}

}  // namespace

std::unique_ptr<ParamSource> open_zero_weights_source(const fs::path& dir) {
  const json j = read_zero_index(dir / kZeroIndexFile);  // its errors first, as before
  return zero_weights_source(dir, j, read_model_config(dir / kConfigFile));
}

std::unique_ptr<ParamSource> open_zero_weights_source(const fs::path& dir,
                                                      const ModelConfig& config) {
  return zero_weights_source(dir, read_zero_index(dir / kZeroIndexFile), config);
}

}  // namespace memfit::io
