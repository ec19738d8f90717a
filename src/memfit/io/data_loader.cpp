// The data loader's window order and batch filling; see data_loader.h and docs/data.md.
#include "memfit/io/data_loader.h"

#include <algorithm>
#include <climits>
#include <random>
#include <utility>

#include "memfit/core/error.h"
#include "memfit/io/token_shard.h"

namespace memfit::io {

namespace fs = std::filesystem;

std::vector<fs::path> find_token_shards(const fs::path& dir, std::string_view split) {
  std::vector<fs::path> shards;
  std::error_code ec;
  const std::string prefix = std::string(split) + "_";
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.starts_with(prefix) && name.ends_with(".bin") && entry.is_regular_file())
      shards.push_back(entry.path());
  }
  if (ec) MEMFIT_THROW(IoError, "data", "cannot list {}: {}", dir.string(), ec.message());
  std::sort(shards.begin(), shards.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return shards;
}

uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(epoch) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void shuffled_indices(uint64_t seed, int32_t* out, int64_t n) {
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) {
    // Uniform in [0, i]: reject the top 2^64 mod (i + 1) draws, then take the remainder.
    const uint64_t range = static_cast<uint64_t>(i) + 1;
    const uint64_t threshold = (0 - range) % range;
    uint64_t r;
    do r = rng(); while (r < threshold);
    std::swap(out[i], out[static_cast<int64_t>(r % range)]);
  }
}

DataLoader::DataLoader(MemoryPool& pool, std::vector<fs::path> shards,
                       const DataLoaderOptions& options)
    : options_(options), shards_(std::move(shards)) {
  const int64_t B = options.batch_size, T = options.seq_len;
  if (B <= 0 || T <= 0)
    MEMFIT_THROW(ConfigError, "data", "batch size and sequence length must be positive, got B={} "
                 "T={}", B, T);
  if (shards_.empty()) MEMFIT_THROW(IoError, "data", "no token shards given");

  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const auto& shard : shards_) {
    counts.push_back(read_token_shard_header(shard));
    total += counts.back();
  }
  if (total < T + 1)
    MEMFIT_THROW(IoError, "data",
                 "{} shard(s) starting with {} hold {} tokens; one window of T={} needs {}",
                 shards_.size(), shards_.front().string(), total, T, T + 1);
  num_windows_ = (total - 1) / T;
  if (options.shuffle && num_windows_ > INT32_MAX)
    MEMFIT_THROW(ConfigError, "data", "{} windows are too many to shuffle (at most {})",
                 num_windows_, INT32_MAX);

  tokens_ = Tensor::empty(pool, Shape{total}, DType::u16, Category::staging, "data.tokens");
  uint16_t* dst = tokens_.data<uint16_t>();
  for (size_t i = 0; i < shards_.size(); ++i) {
    read_token_shard_into(shards_[i], {dst, static_cast<size_t>(counts[i])}, options.vocab_size);
    dst += counts[i];
  }
  inputs_ = Tensor::empty(pool, Shape{B, T}, DType::i32, Category::staging, "data.inputs");
  targets_ = Tensor::empty(pool, Shape{B, T}, DType::i32, Category::staging, "data.targets");
  if (options.shuffle)
    permutation_ = Tensor::empty(pool, Shape{num_windows_}, DType::i32, Category::staging,
                                 "data.permutation");
}

size_t DataLoader::staging_bytes(const std::vector<fs::path>& shards,
                                 const DataLoaderOptions& options) {
  int64_t total = 0;
  for (const auto& shard : shards) total += read_token_shard_header(shard);
  const int64_t T = options.seq_len, B = options.batch_size;
  const int64_t windows = T > 0 ? std::max<int64_t>(0, (total - 1) / T) : 0;
  auto block = [](int64_t bytes) { return MemoryPool::round_up(static_cast<size_t>(bytes)); };
  // The same allocations as the constructor: tokens, inputs, targets, permutation.
  return block(total * 2) + 2 * block(B * T * 4) + (options.shuffle ? block(windows * 4) : 0);
}

DataLoader DataLoader::train(MemoryPool& pool, const fs::path& dir,
                             const DataLoaderOptions& options) {
  auto shards = find_token_shards(dir, "train");
  if (shards.empty())
    MEMFIT_THROW(IoError, "data", "no training shards (train_*.bin) in {}; make them with "
                 "`memfit prepare --input FILE --out {}`", dir.string(), dir.string());
  return DataLoader(pool, std::move(shards), options);
}

DataLoader DataLoader::val(MemoryPool& pool, const fs::path& dir, DataLoaderOptions options) {
  auto shards = find_token_shards(dir, "val");
  if (shards.empty())
    MEMFIT_THROW(IoError, "data", "no validation shards (val_*.bin) in {}; `memfit prepare` "
                 "writes them unless --val-fraction is 0", dir.string());
  options.shuffle = false;
  return DataLoader(pool, std::move(shards), options);
}

void DataLoader::set_position(int64_t k) {
  MEMFIT_CHECK(k >= 0, "data", "position must be >= 0, got {}", k);
  position_ = k;
}

const int32_t* DataLoader::permutation(int64_t epoch) const {
  if (permutation_epoch_ != epoch) {
    shuffled_indices(epoch_seed(options_.seed, epoch), permutation_.data<int32_t>(),
                     num_windows_);
    permutation_epoch_ = epoch;
  }
  return permutation_.data<int32_t>();
}

int64_t DataLoader::window_index(int64_t k, int64_t b) const {
  const int64_t visit = k * options_.batch_size + b;  // windows visited before this one
  if (!options_.shuffle) return visit % num_windows_;
  return permutation(visit / num_windows_)[visit % num_windows_];
}

void DataLoader::next_batch() {
  const int64_t B = options_.batch_size, T = options_.seq_len;
  const uint16_t* tokens = tokens_.data<uint16_t>();
  int32_t* x = inputs_.data<int32_t>();
  int32_t* y = targets_.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const uint16_t* window = tokens + window_index(position_, b) * T;
    for (int64_t t = 0; t < T; ++t) {
      x[b * T + t] = window[t];
      y[b * T + t] = window[t + 1];
    }
  }
  ++position_;
}

}  // namespace memfit::io
