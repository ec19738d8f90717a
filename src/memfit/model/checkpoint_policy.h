// Activation checkpointing: which blocks keep their activations for backward and which keep only
// their input and are recomputed in backward (`--ckpt`). A policy becomes a list of segments of
// consecutive blocks; a segment's blocks are recomputed together, from the input of its first
// block, just before the backward of its last block, into buffers shared by all segments. So
// `full` is one-block segments, `every:K` K-block segments (K = round(sqrt(layers)) is the
// classic sqrt(N) schedule), `layers:LIST` one-block segments on the listed blocks. `selective`
// recomputes only the attention core (Megatron-LM's selective recomputation): plain attention
// drops its saved (T, T) probabilities and recomputes them from q and k in backward; flash
// attention already works that way, so selective is the same as none with it.
// Recomputation runs the same kernels on the same inputs, so in FP32 gradients are bit-identical
// to `none` (tests/model/checkpoint_test.cpp).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memfit {

struct CheckpointPolicy {
  enum class Kind { none, full, selective, every, layers };
  Kind kind = Kind::none;
  int every = 0;            // every:K
  std::vector<int> layers;  // layers:LIST, sorted, unique

  // "none", "full", "selective", "every:K" (K >= 1), "layers:0,3,5" or with ranges
  // "layers:0-4,7" (may be empty: "layers:"). ConfigError naming --ckpt and the expectation
  // otherwise. "auto" is not a policy: the planner resolves it to one
  // (cli/options/resolve_train_spec.h).
  static CheckpointPolicy parse(std::string_view text);
  std::string name() const;  // parse(name()) == *this; runs of 3+ blocks as ranges "0-4"
  bool operator==(const CheckpointPolicy&) const = default;

  // The recomputed segments [first, last] for a model of n_layer blocks, in order. ConfigError
  // if layers:LIST names a block >= n_layer.
  std::vector<std::pair<int, int>> segments(int n_layer) const;
  bool selective() const { return kind == Kind::selective; }
};

}  // namespace memfit
