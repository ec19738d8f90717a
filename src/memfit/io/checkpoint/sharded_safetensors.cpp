// Sharded safetensors: shard planning and writing, index parsing and cross-checking. The layout
// is transformers' (modeling_utils.save_pretrained / load_sharded_checkpoint).
#include "memfit/io/checkpoint/sharded_safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <system_error>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::string join_mismatches(const std::vector<std::string>& m) {
  constexpr size_t kMismatchesShown = 8;
  std::string s;
  for (size_t i = 0; i < m.size() && i < kMismatchesShown; ++i) s += (i ? "; " : "") + m[i];
  if (m.size() > kMismatchesShown) s += fmt::format("; and {} more", m.size() - kMismatchesShown);
  return s;
}

namespace {

[[noreturn]] void refuse(const fs::path& index, const std::vector<std::string>& m) {
  MEMFIT_THROW(IoError, "safetensors", "{}: the index does not match its files: {} problem{}: {}",
               index.string(), m.size(), m.size() == 1 ? "" : "s", join_mismatches(m));
}

uint64_t stored_bytes(const ShardTensor& t) {
  if (!t.produce && !t.scattered) return t.tensor.nbytes();
  uint64_t n = dtype_size(t.store_as.value_or(t.dtype));
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

uint64_t parse_max_shard_size(std::string_view text, std::string_view what) {
  const std::string t(text);
  char* end = nullptr;
  const double value = std::strtod(t.c_str(), &end);
  std::string unit(end == nullptr ? "" : end);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0;
  for (auto [name, s] : {std::pair<const char*, double>{"", 1}, {"B", 1}, {"KB", 1e3},
                         {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"KIB", 1024.0},
                         {"MIB", 1024.0 * 1024}, {"GIB", 1024.0 * 1024 * 1024},
                         {"TIB", 1024.0 * 1024 * 1024 * 1024}})
    if (unit == name) scale = s;
  const double bytes = value * scale;
  if (end == t.c_str() || scale == 0 || !(bytes >= 1) || !(bytes < 1.8e19))
    MEMFIT_THROW(ConfigError, "config",
                 "{}: cannot read '{}' as a shard size; expected a positive number with an "
                 "optional unit (B, KB, MB, GB, TB as powers of 1000; KiB, MiB, GiB, TiB as powers "
                 "of 1024), e.g. 5GB",
                 what, text);
  return static_cast<uint64_t>(bytes);
}

std::string shard_file_name(int k, int n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n);
}

std::vector<int> plan_shards(const std::vector<uint64_t>& bytes, uint64_t max_shard_bytes) {
  std::vector<int> shard(bytes.size());
  int current = 0;
  uint64_t filled = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (filled > 0 && filled + bytes[i] > max_shard_bytes) {
      ++current;
      filled = 0;
    }
    shard[i] = current;
    filled += bytes[i];
  }
  return shard;
}

std::vector<std::string> write_model_safetensors(const fs::path& dir,
                                                 const std::vector<ShardTensor>& tensors,
                                                 const ShardedWriteOptions& options) {
  MEMFIT_CHECK(options.max_shard_bytes > 0, "safetensors", "max_shard_bytes must be positive");
  std::vector<uint64_t> bytes;
  uint64_t total = 0;
  for (const ShardTensor& t : tensors) {
    bytes.push_back(stored_bytes(t));
    total += bytes.back();
  }
  const std::vector<int> shard = plan_shards(bytes, options.max_shard_bytes);
  const int n = shard.empty() ? 1 : shard.back() + 1;
  auto write_one = [&](const std::string& name, int k) {
    SafetensorsWriter w;
    w.set_staging_pool(options.staging_pool);
    // This file's tensors are a run [first, last); a scattered one's writer id, by index.
    size_t first = tensors.size(), last = 0;
    std::map<size_t, size_t> scattered;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (k < 0 || shard[i] == k) {
        const ShardTensor& t = tensors[i];
        first = std::min(first, i);
        last = i + 1;
        if (t.scattered)
          scattered[i] = w.add_scattered(t.name, safetensors_dtype_of(t.dtype), t.shape);
        else if (t.produce)
          w.add_deferred(t.name, t.shape, t.dtype, t.produce, t.store_as, t.transpose);
        else
          w.add(t.name, t.tensor, std::nullopt, t.transpose);
      }
    for (const auto& [key, value] : options.metadata) w.set_metadata(key, value);
    if (!scattered.empty()) {
      MEMFIT_CHECK(options.scatter, "safetensors", "scattered tensors and no scatter pass");
      w.set_scatter([&, first, last](const SafetensorsWriter::ScatterSink& sink) {
        options.scatter(first, last, [&](size_t i, uint64_t offset, const void* data, size_t n) {
          auto it = scattered.find(i);
          MEMFIT_CHECK(it != scattered.end(), "safetensors",
                       "tensor #{} is not a scattered tensor of {}", i, name);
          sink(it->second, offset, data, n);
        });
      });
    }
    w.write(dir / name);
  };
  if (n == 1) {
    write_one(std::string(kModelFile), -1);
    return {std::string(kModelFile)};
  }
  std::vector<std::string> files;
  json weight_map = json::object();
  for (int k = 0; k < n; ++k) {
    files.push_back(shard_file_name(k + 1, n));
    write_one(files.back(), k);
  }
  for (size_t i = 0; i < tensors.size(); ++i) weight_map[tensors[i].name] = files[shard[i]];
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(dir / kModelIndexFile, index.dump(2) + "\n");
  files.emplace_back(kModelIndexFile);
  return files;
}

ModelSafetensors::ModelSafetensors(const fs::path& path) {
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(path, ec)) {
    file = path / kModelFile;
    if (!fs::exists(file, ec)) {
      const fs::path index = path / kModelIndexFile;
      if (!fs::exists(index, ec))
        MEMFIT_THROW(IoError, "safetensors", "{}: neither {} nor {}", path.string(), kModelFile,
                     kModelIndexFile);
      file = index;
    }
  }
  if (ends_with(file.filename().string(), ".index.json")) {
    open_index(file);
  } else {
    source_ = file;
    files_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const SafetensorsEntry& e : files_.back()->entries())
      tensors_.push_back({files_.back().get(), &e});
  }
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].entry->name, i);
}

void ModelSafetensors::open_index(const fs::path& index) {
  source_ = index;
  sharded_ = true;
  const std::string text = read_file_to_string(index);
  // nlohmann keeps the last of two equal keys; a tensor listed twice is an error, so watch.
  std::string top, duplicate;
  std::set<std::string> listed;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key) {
      if (depth == 1) top = parsed.get<std::string>();
      if (depth == 2 && top == "weight_map" && !listed.insert(parsed.get<std::string>()).second &&
          duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, on_event);
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "safetensors", "{}: not valid JSON: {}", index.string(), e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    MEMFIT_THROW(IoError, "safetensors", "{}: expected an object with a \"weight_map\" object",
                 index.string());
  std::vector<std::string> problems;
  if (!duplicate.empty())
    problems.push_back(fmt::format("'{}' is listed twice in weight_map", duplicate));

  // The files, in name order, and what the index says each holds.
  std::map<std::string, std::vector<std::string>> listed_in;
  for (auto& [name, f] : j["weight_map"].items()) {
    if (!f.is_string())
      MEMFIT_THROW(IoError, "safetensors", "{}: weight_map['{}'] must be a file name, got {}",
                   index.string(), name, f.dump());
    const std::string file = f.get<std::string>();
    const fs::path rel(file);
    bool safe = !file.empty() && rel.is_relative();
    for (const fs::path& part : rel) safe &= part != "..";
    if (!safe)
      MEMFIT_THROW(IoError, "safetensors",
                   "{}: weight_map['{}'] names '{}', which is not a file beside the index",
                   index.string(), name, file);
    listed_in[file].push_back(name);
  }
  std::error_code ec;
  for (const auto& [file, names] : listed_in) {
    const fs::path p = index.parent_path() / file;
    if (!fs::exists(p, ec)) {
      problems.push_back(fmt::format("{} does not exist (the index maps '{}'{} to it)", file,
                                     names.front(),
                                     names.size() > 1
                                         ? fmt::format(" and {} more", names.size() - 1)
                                         : std::string()));
      continue;
    }
    files_.push_back(std::make_unique<SafetensorsReader>(p));
  }
  if (!problems.empty()) refuse(index, problems);

  // Each file's tensors against the index: all listed, listed for this file, in one file only.
  const json& map = j["weight_map"];
  std::map<std::string, const SafetensorsReader*> seen;
  size_t k = 0;
  for (const auto& [file, names] : listed_in) {  // files_[k] holds `file`: none was missing
    const auto& reader = files_[k++];
    for (const SafetensorsEntry& e : reader->entries()) {
      auto [it, first] = seen.emplace(e.name, reader.get());
      if (!first) {
        problems.push_back(fmt::format("'{}' is in both {} and {}", e.name,
                                       it->second->path().filename().string(), file));
      } else if (!map.contains(e.name)) {
        problems.push_back(fmt::format("{} holds '{}', which the index does not list", file,
                                       e.name));
      } else if (map[e.name] != file) {
        problems.push_back(fmt::format("{} holds '{}', which the index puts in {}", file, e.name,
                                       map[e.name].get<std::string>()));
      }
      tensors_.push_back({reader.get(), &e});
    }
  }
  for (const auto& [name, f] : map.items())
    if (!seen.count(name))
      problems.push_back(fmt::format("the index puts '{}' in {}, which does not hold it", name,
                                     f.get<std::string>()));
  if (!problems.empty()) refuse(index, problems);
}

const StoredTensor* ModelSafetensors::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::string ModelSafetensors::where(const StoredTensor& t) const {
  return sharded_ ? " in " + t.file->path().filename().string() : std::string();
}

}  // namespace memfit::io
