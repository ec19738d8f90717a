// The data loader: turns token shards into (B, T) input and target batches in an order that is a
// documented function of the micro-batch number, so runs are reproducible and resumable from a
// single integer. The contract is in docs/data.md; tests/io/data_loader_test.cpp checks it.
//
// The shards stay on disk: each batch reads its B windows (T + 1 tokens each) with pread into a
// fixed (B, T + 1) staging tensor, so the pool bytes do not grow with the dataset (a run on
// billions of tokens holds what a run on Brown does, but for the shuffle's permutation, 4 bytes
// per window). staging_bytes() gives them without opening a shard when there is no shuffle.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"

namespace memfit::io {

struct DataLoaderOptions {
  int64_t batch_size = 0;  // B: rows per micro-batch
  int64_t seq_len = 0;     // T: tokens per row
  bool shuffle = false;    // visit windows in a seeded random order per epoch
  uint64_t seed = 0;
  std::optional<int32_t> vocab_size;  // when set, every token must be below it
  // Where vocab_size came from, for the error about a token outside it: e.g. "preset gpt2-tiny"
  // makes it say so and name the option that fixes it (--vocab). Empty: a plain message.
  std::string vocab_source;
  // Data parallelism (docs/data.md, "Ranks"): with `world` ranks, micro-batch k of rank `rank`
  // is rows [rank B, (rank + 1) B) of micro-batch k of one process with batch world x B.
  int world = 1, rank = 0;
};

// The shards of one split in `dir`: files named <split>_*.bin ("train", "val"), sorted by name.
// Empty if there are none.
std::vector<std::filesystem::path> find_token_shards(const std::filesystem::path& dir,
                                                     std::string_view split);

class ShardSet;  // the open shard files (data_loader.cpp)

class DataLoader {
 public:
  // The pool bytes a loader over `shards` with these options allocates (Category::staging),
  // from the shard headers alone: what the planner predicts. The same as
  // buffer_bytes(options) + permutation_bytes(windows) for the shards' window count.
  static size_t staging_bytes(const std::vector<std::filesystem::path>& shards,
                              const DataLoaderOptions& options);
  // What does not depend on the data: the (B, T + 1) int32 window staging (int32 whatever the
  // shards' token width, so it does not depend on them) and the (B, T) int32 inputs and
  // targets, each rounded to the pool's alignment; with `masked` (the shards have loss-mask
  // shards, loss_mask.h), the (B, T) u8 mask too.
  static size_t buffer_bytes(const DataLoaderOptions& options, bool masked = false);
  // With shuffle, the epoch's permutation: 4 bytes per window (0 without shuffle).
  static size_t permutation_bytes(const DataLoaderOptions& options, int64_t num_windows);

  // Opens `shards` (concatenated in the given order; their headers are checked) and, when they
  // have loss-mask shards beside them (all or none: loss_mask.h), those too, and allocates
  // the staging. With a vocabulary size it reads every token once, through the staging, to
  // check it. Throws ConfigError for a bad B or T, IoError for a bad shard, a token outside the
  // vocabulary, or when the tokens do not make one window.
  DataLoader(MemoryPool& pool, std::vector<std::filesystem::path> shards,
             const DataLoaderOptions& options);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  // train_*.bin in `dir`, sorted by name. Throws IoError if there are none.
  static DataLoader train(MemoryPool& pool, const std::filesystem::path& dir,
                          const DataLoaderOptions& options);
  // Both check that masked data (chat, instruct) was padded to windows of seq_len: ConfigError
  // naming the --seq-len it was prepared with otherwise.
  // val_*.bin in `dir`, windows in order (shuffle is ignored). Throws IoError if there are none.
  static DataLoader val(MemoryPool& pool, const std::filesystem::path& dir,
                        DataLoaderOptions options);

  // Fills inputs() and targets() with micro-batch position() and moves to the next one.
  void next_batch();
  // int32 (B, T), allocated once (Category::staging) and refilled by next_batch().
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }
  // Loss masks (docs/data.md, "Loss masks"): whether the shards have mask shards, and then the
  // (B, T) u8 mask of the batch, refilled by next_batch() with targets(): 1 where the target
  // counts in the loss (allocated once, Category::staging, "data.mask").
  bool has_loss_mask() const;
  const Tensor& loss_mask() const { return mask_; }
  // The masked-in targets of micro-batches [first, first + count) over EVERY rank's rows (the
  // global micro-batches, as one process with batch world x B reads them): the denominator of
  // a step's mean loss, the same on every rank without communication. Reads the masks through
  // the window staging (clobbers it, not inputs(), targets() or loss_mask()).
  int64_t count_masked(int64_t first, int64_t count);

  // The number of the micro-batch next_batch() loads next (k, counting from 0 across gradient
  // accumulation steps). Save it with a checkpoint; set it to resume.
  int64_t position() const { return position_; }
  void set_position(int64_t k);

  // Window (index into the dataset's T-token windows) that row b of micro-batch k reads:
  // tokens [w * T, w * T + T], inputs the first T, targets the last T.
  int64_t window_index(int64_t k, int64_t b) const;

  int64_t batch_size() const { return options_.batch_size; }
  int64_t seq_len() const { return options_.seq_len; }
  int64_t num_tokens() const { return num_tokens_; }
  // Calls `chunk` on every token of the split in file order, a staging-sized piece at a time
  // (read through the window staging, so it allocates nothing). Clobbers the window staging,
  // not inputs() or targets().
  // Shards of both versions (uint16 and uint32 tokens, token_shard.h) mix freely.
  void scan(const std::function<void(std::span<const int32_t>)>& chunk);
  // Whole windows in the data: floor((N - 1) / T).
  int64_t num_windows() const { return num_windows_; }
  // Micro-batches that visit every window once: ceil(num_windows / (world B)).
  int64_t batches_per_epoch() const {
    const int64_t global = batch_size() * options_.world;
    return (num_windows_ + global - 1) / global;
  }
  const std::vector<std::filesystem::path>& shards() const { return shards_; }

 private:
  // The permutation of epoch `epoch` (shuffle only), computed when first asked for.
  const int32_t* permutation(int64_t epoch) const;
  // The window the `visit`-th row of the run reads (counting every rank's rows).
  int64_t window_of_visit(int64_t visit) const;
  // Reads tokens [start, start + dst.size()) of the split into dst, checking the vocabulary.
  void read_tokens(int64_t start, std::span<int32_t> dst) const;

  DataLoaderOptions options_;
  std::vector<std::filesystem::path> shards_;
  std::unique_ptr<ShardSet> files_;
  int64_t num_tokens_ = 0;
  Tensor window_;  // i32 (B, T + 1): the tokens of one batch's windows
  Tensor inputs_, targets_;
  Tensor mask_;  // u8 (B, T), masked data only
  int64_t num_windows_ = 0;
  int64_t position_ = 0;
  mutable Tensor permutation_;  // i32 (num_windows), shuffle only
  mutable int64_t permutation_epoch_ = -1;
};

// ConfigError when the shards in `dir` have loss masks and dataset.json says their records were
// padded to windows of another length than seq_len (DataLoader::train and ::val call it).
void check_loss_mask_window(const std::filesystem::path& dir,
                            const std::vector<std::filesystem::path>& shards, int64_t seq_len);

// IoError when dataset.json in `dir` says its documents begin with an end-of-text token that
// the model's vocabulary of `vocab_size` does not hold (shards prepared with another tokenizer):
// the loader would find that token at position 0, but only after the model's set-up, which takes
// minutes at 7B. `vocab_source` names where the vocabulary came from, as DataLoaderOptions'.
// Nothing to check without a dataset.json (shards from elsewhere): the loader checks them.
void check_dataset_vocab(const std::filesystem::path& dir, int64_t vocab_size,
                         const std::string& vocab_source);

// Fisher-Yates permutation of [0, n) from std::mt19937_64 seeded with `seed`, drawing indices
// by rejection (no std::uniform_int_distribution), so it is the same on every platform.
void shuffled_indices(uint64_t seed, int32_t* out, int64_t n);
// The seed of epoch `epoch`'s permutation: splitmix64 of the loader's seed and the epoch.
uint64_t epoch_seed(uint64_t seed, int64_t epoch);

}  // namespace memfit::io
