// GPT-2 shape: layers, heads, width, context and vocabulary, with the named presets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memfit {

struct GPT2Config {
  int n_layer = 2;
  int n_head = 4;
  int d_model = 96;
  int max_seq_len = 64;     // n_positions
  int vocab_size = 512;     // real tokens
  int padded_vocab = 512;   // rows of wte: vocab_size rounded up to a multiple of 64

  int head_size() const { return d_model / n_head; }
  // Checks the fields and sets padded_vocab; throws ConfigError naming the field at fault.
  void finalize();
  int64_t num_params() const;  // elements in the parameter slab (padding rows included)
  std::string describe() const;

  static GPT2Config preset(std::string_view name);
  static std::vector<std::string> preset_names();
};

inline constexpr int kVocabPadMultiple = 64;

}  // namespace memfit
