// The data loader's window order and batch filling; see data_loader.h and docs/data.md.
#include "memfit/io/data/data_loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <utility>

#include "memfit/core/error.h"
#include "memfit/io/data/loss_mask.h"
#include "memfit/io/data/prepare.h"
#include "memfit/io/data/token_shard.h"

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

// The shard files of one split, open for the loader's lifetime, and where each starts in the
// concatenated token sequence.
class ShardSet {
 public:
  ShardSet(const std::vector<fs::path>& paths) : paths_(paths) {
    starts_.push_back(0);
    try {
      const bool masked = have_loss_masks(paths_);
      for (const auto& path : paths_) {
        const ShardInfo info = read_token_shard_info(path);  // checks magic, version, size
        fds_.push_back(open_file(path));
        token_bytes_.push_back(info.token_bytes);
        starts_.push_back(starts_.back() + info.count);
        if (!masked) continue;
        const fs::path mask = loss_mask_path(path);
        const int64_t count = read_loss_mask_header(mask);  // checks magic, version, size
        if (count != info.count)
          MEMFIT_THROW(IoError, "data", "{} holds {} mask bytes but its token shard {} holds {} "
                       "tokens; prepare the data again", mask.string(), count,
                       path.filename().string(), info.count);
        mask_fds_.push_back(open_file(mask));
        mask_paths_.push_back(mask);
      }
    } catch (...) {
      close_all();
      throw;
    }
  }
  ~ShardSet() { close_all(); }
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  int64_t total() const { return starts_.back(); }
  const fs::path& path(size_t s) const { return paths_[s]; }
  bool masked() const { return !mask_fds_.empty(); }

  // Mask bytes [start, start + n) of the concatenated mask shards into dst, each checked to be
  // 0 or 1.
  void read_mask(int64_t start, uint8_t* dst, int64_t n) const {
    size_t s = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
    while (n > 0) {
      const int64_t at = start - starts_[s];
      const int64_t take = std::min(n, starts_[s + 1] - starts_[s] - at);
      pread_all(mask_fds_[s], dst, static_cast<size_t>(take), kShardHeaderBytes + at,
                mask_paths_[s], take, at);
      for (int64_t i = 0; i < take; ++i)
        if (dst[i] > 1)
          MEMFIT_THROW(IoError, "mask", "{}: byte {} at position {} is not 0 or 1",
                       mask_paths_[s].string(), int(dst[i]), at + i);
      start += take;
      dst += take;
      n -= take;
      ++s;
    }
  }

  // Tokens [start, start + n) into dst as int32, crossing shard boundaries (and token widths)
  // as needed. Calls `check(shard, position in shard, tokens)` on each piece read.
  template <class Check>
  void read(int64_t start, int32_t* dst, int64_t n, Check&& check) const {
    size_t s = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
    while (n > 0) {
      const int64_t at = start - starts_[s];
      const int64_t take = std::min(n, starts_[s + 1] - at - starts_[s]);
      const int64_t width = token_bytes_[s];
      pread_all(fds_[s], dst, static_cast<size_t>(take * width), kShardHeaderBytes + at * width,
                paths_[s], take, at);
      if (width == 2) {
        // Widen in place from the back: token i's two bytes sit at or before its four.
        const auto* narrow = reinterpret_cast<const uint16_t*>(dst);
        for (int64_t i = take - 1; i >= 0; --i) dst[i] = narrow[i];
      } else {
        for (int64_t i = 0; i < take; ++i)
          if (dst[i] < 0)
            MEMFIT_THROW(IoError, "shard", "{}: token {} at position {} is above {}, the "
                         "largest id memfit handles", paths_[s].string(),
                         static_cast<uint32_t>(dst[i]), at + i, INT32_MAX);
      }
      check(s, at, std::span<const int32_t>(dst, static_cast<size_t>(take)));
      start += take;
      dst += take;
      n -= take;
      ++s;
    }
  }

 private:
  static int open_file(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      MEMFIT_THROW(IoError, "data", "cannot open {}: {}", path.string(), std::strerror(errno));
    return fd;
  }
  void close_all() {
    for (int fd : fds_) ::close(fd);
    for (int fd : mask_fds_) ::close(fd);
    fds_.clear();
    mask_fds_.clear();
  }
  // Reads exactly `bytes` at `offset` of `fd` (the `count` tokens at position `at` of `path`).
  static void pread_all(int fd, void* dst, size_t bytes, off_t offset, const fs::path& path,
                        int64_t count, int64_t at) {
    char* out = static_cast<char*>(dst);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd, out, bytes, offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        MEMFIT_THROW(IoError, "data", "{}: cannot read {} tokens at position {}: {}",
                     path.string(), count, at,
                     got < 0 ? std::strerror(errno) : "the file was truncated");
      out += got;
      bytes -= static_cast<size_t>(got);
      offset += got;
    }
  }

  std::vector<fs::path> paths_;
  std::vector<int> fds_;
  std::vector<int> mask_fds_;  // the loss-mask shards, when the data has them (loss_mask.h)
  std::vector<fs::path> mask_paths_;
  std::vector<int32_t> token_bytes_;  // 2 (version 1) or 4 (version 2) per shard
  std::vector<int64_t> starts_;  // token offset of each shard, and the total at the end
};

DataLoader::DataLoader(MemoryPool& pool, std::vector<fs::path> shards,
                       const DataLoaderOptions& options)
    : options_(options), shards_(std::move(shards)) {
  const int64_t B = options.batch_size, T = options.seq_len;
  if (B <= 0 || T <= 0)
    MEMFIT_THROW(ConfigError, "data", "batch size and sequence length must be positive, got B={} "
                 "T={}", B, T);
  if (shards_.empty()) MEMFIT_THROW(IoError, "data", "no token shards given");

  files_ = std::make_unique<ShardSet>(shards_);
  num_tokens_ = files_->total();
  if (num_tokens_ < T + 1)
    MEMFIT_THROW(IoError, "data",
                 "{} shard(s) starting with {} hold {} tokens; one window of T={} needs {}",
                 shards_.size(), shards_.front().string(), num_tokens_, T, T + 1);
  num_windows_ = (num_tokens_ - 1) / T;
  if (options.shuffle && num_windows_ > INT32_MAX)
    MEMFIT_THROW(ConfigError, "data", "{} windows are too many to shuffle (at most {})",
                 num_windows_, INT32_MAX);

  // The same allocations, in the same order, as buffer_bytes and permutation_bytes count.
  window_ = Tensor::empty(pool, Shape{B, T + 1}, DType::i32, Category::staging, "data.window");
  inputs_ = Tensor::empty(pool, Shape{B, T}, DType::i32, Category::staging, "data.inputs");
  targets_ = Tensor::empty(pool, Shape{B, T}, DType::i32, Category::staging, "data.targets");
  if (files_->masked())
    mask_ = Tensor::empty(pool, Shape{B, T}, DType::u8, Category::staging, "data.mask");
  if (options.shuffle)
    permutation_ = Tensor::empty(pool, Shape{num_windows_}, DType::i32, Category::staging,
                                 "data.permutation");
  // Every token is checked against the vocabulary once, here, rather than hours into a run.
  if (options.vocab_size) scan([](std::span<const int32_t>) {});
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

size_t DataLoader::buffer_bytes(const DataLoaderOptions& options, bool masked) {
  const int64_t T = options.seq_len, B = options.batch_size;
  auto block = [](int64_t bytes) { return MemoryPool::round_up(static_cast<size_t>(bytes)); };
  return block(B * (T + 1) * 4) + 2 * block(B * T * 4) + (masked ? block(B * T) : 0);
}

size_t DataLoader::permutation_bytes(const DataLoaderOptions& options, int64_t num_windows) {
  return options.shuffle ? MemoryPool::round_up(static_cast<size_t>(num_windows) * 4) : 0;
}

size_t DataLoader::staging_bytes(const std::vector<fs::path>& shards,
                                 const DataLoaderOptions& options) {
  size_t bytes = buffer_bytes(options, have_loss_masks(shards));
  if (options.shuffle) {  // only the permutation depends on the data: its window count
    int64_t total = 0;
    for (const auto& shard : shards) total += read_token_shard_header(shard);
    const int64_t T = options.seq_len;
    bytes += permutation_bytes(options, T > 0 ? std::max<int64_t>(0, (total - 1) / T) : 0);
  }
  return bytes;
}

void DataLoader::read_tokens(int64_t start, std::span<int32_t> dst) const {
  files_->read(start, dst.data(), static_cast<int64_t>(dst.size()),
               [&](size_t shard, int64_t at, std::span<const int32_t> got) {
                 if (!options_.vocab_size) return;
                 for (size_t i = 0; i < got.size(); ++i)
                   if (got[i] >= *options_.vocab_size)
                     MEMFIT_THROW(IoError, "shard",
                                  "{}: token {} at position {} is outside the vocabulary: "
                                  "expected < {}{} (was the shard prepared with another "
                                  "tokenizer?)",
                                  files_->path(shard).string(), got[i], at + int64_t(i),
                                  *options_.vocab_size,
                                  options_.vocab_source.empty()
                                      ? ""
                                      : fmt::format(", the vocabulary of {}; --vocab {} or "
                                                    "more holds this token",
                                                    options_.vocab_source, got[i] + 1));
               });
}

void DataLoader::scan(const std::function<void(std::span<const int32_t>)>& chunk) {
  int32_t* buf = window_.data<int32_t>();
  const int64_t room = window_.numel();
  for (int64_t start = 0; start < num_tokens_; start += room) {
    const int64_t n = std::min(room, num_tokens_ - start);
    read_tokens(start, {buf, static_cast<size_t>(n)});
    chunk({buf, static_cast<size_t>(n)});
  }
}

DataLoader DataLoader::train(MemoryPool& pool, const fs::path& dir,
                             const DataLoaderOptions& options) {
  auto shards = find_token_shards(dir, "train");
  if (shards.empty())
    MEMFIT_THROW(IoError, "data", "no training shards (train_*.bin) in {}; make them with "
                 "`memfit prepare --input FILE --out {}`", dir.string(), dir.string());
  check_loss_mask_window(dir, shards, options.seq_len);
  return DataLoader(pool, std::move(shards), options);
}

void check_dataset_vocab(const fs::path& dir, int64_t vocab_size, const std::string& vocab_source) {
  const std::optional<DatasetInfo> info = read_dataset_info(dir);
  if (!info || info->eot_token < vocab_size) return;
  MEMFIT_THROW(IoError, "shard",
               "{}: its documents begin with token {} ({} in {}), outside the vocabulary: "
               "expected < {}{} (was the data prepared with another tokenizer?)",
               dir.string(), info->eot_token, info->tokenizer.empty() ? "end of text" :
               info->tokenizer + "'s end of text", kDatasetInfoFile, vocab_size,
               vocab_source.empty() ? "" : fmt::format(", the vocabulary of {}; --vocab {} or "
                                                       "more holds this token",
                                                       vocab_source, info->vocab_size));
}

void check_loss_mask_window(const fs::path& dir, const std::vector<fs::path>& shards,
                            int64_t seq_len) {
  if (!have_loss_masks(shards)) return;
  const auto info = read_dataset_info(dir);
  if (info && info->window > 0 && info->window != seq_len)
    MEMFIT_THROW(ConfigError, "data", "{} holds {} records padded to windows of {} tokens "
                 "(memfit prepare --seq-len {}), so each is one window of --seq-len {}; got "
                 "--seq-len {} (prepare again with --seq-len {} or train with --seq-len {})",
                 dir.string(), info->format, info->window, info->window, info->window, seq_len,
                 seq_len, info->window);
}

DataLoader DataLoader::val(MemoryPool& pool, const fs::path& dir, DataLoaderOptions options) {
  auto shards = find_token_shards(dir, "val");
  if (shards.empty())
    MEMFIT_THROW(IoError, "data", "no validation shards (val_*.bin) in {}; `memfit prepare` "
                 "writes them unless --val-fraction is 0", dir.string());
  options.shuffle = false;
  check_loss_mask_window(dir, shards, options.seq_len);
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
  // Windows visited before this one, counting every rank's rows of the global micro-batch.
  const int64_t B = options_.batch_size;
  return window_of_visit((k * options_.world + options_.rank) * B + b);
}

int64_t DataLoader::window_of_visit(int64_t visit) const {
  if (!options_.shuffle) return visit % num_windows_;
  return permutation(visit / num_windows_)[visit % num_windows_];
}

void DataLoader::next_batch() {
  const int64_t B = options_.batch_size, T = options_.seq_len;
  int32_t* staged = window_.data<int32_t>();
  int32_t* x = inputs_.data<int32_t>();
  int32_t* y = targets_.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    int32_t* window = staged + b * (T + 1);
    const int64_t w = window_index(position_, b);
    read_tokens(w * T, {window, static_cast<size_t>(T + 1)});
    for (int64_t t = 0; t < T; ++t) {
      x[b * T + t] = window[t];
      y[b * T + t] = window[t + 1];
    }
    // Target t is token w T + t + 1; its mask byte lies at the same position.
    if (mask_.defined()) files_->read_mask(w * T + 1, mask_.data<uint8_t>() + b * T, T);
  }
  ++position_;
}

bool DataLoader::has_loss_mask() const { return files_->masked(); }

int64_t DataLoader::count_masked(int64_t first, int64_t count) {
  MEMFIT_CHECK(has_loss_mask(), "data", "count_masked on data without loss-mask shards");
  const int64_t B = options_.batch_size, T = options_.seq_len;
  // The window staging holds B (T + 1) int32: room for T mask bytes with plenty to spare.
  auto* bytes = reinterpret_cast<uint8_t*>(window_.data<int32_t>());
  int64_t masked = 0;
  for (int64_t k = first; k < first + count; ++k)
    for (int64_t rank = 0; rank < options_.world; ++rank)
      for (int64_t b = 0; b < B; ++b) {
        const int64_t w = window_of_visit((k * options_.world + rank) * B + b);
        files_->read_mask(w * T + 1, bytes, T);
        for (int64_t t = 0; t < T; ++t) masked += bytes[t];
      }
  return masked;
}

}  // namespace memfit::io
