#include "memfit/model/gpt2_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/core/error.h"
#include "memfit/model/param_layout.h"

namespace memfit {

namespace {
struct Preset {
  const char* name;
  int n_layer, n_head, d_model, max_seq_len, vocab_size;
};
// gpt2-tiny is for tests (~0.3M parameters); gpt2-small-test is the 6-layer, 384-wide shape
// the benchmarks compare with PyTorch; the rest are GPT-2's published sizes.
constexpr Preset kPresets[] = {
    {"gpt2-tiny", 2, 4, 96, 64, 512},
    {"gpt2-small-test", 6, 6, 384, 256, 50257},
    {"gpt2", 12, 12, 768, 1024, 50257},
    {"gpt2-medium", 24, 16, 1024, 1024, 50257},
    {"gpt2-large", 36, 20, 1280, 1024, 50257},
    {"gpt2-xl", 48, 25, 1600, 1024, 50257},
};
}  // namespace

void GPT2Config::finalize() {
  auto positive = [](int v, const char* field) {
    if (v <= 0) MEMFIT_THROW(ConfigError, "config", "{} must be positive, got {}", field, v);
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(d_model, "d_model");
  positive(max_seq_len, "seq_len");
  positive(vocab_size, "vocab");
  if (d_model % n_head != 0)
    MEMFIT_THROW(ConfigError, "config", "d_model {} is not a multiple of n_head {}", d_model,
                 n_head);
  padded_vocab = (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
}

int64_t GPT2Config::num_params() const { return ParamLayout(*this).total(); }

std::string GPT2Config::describe() const {
  return fmt::format("{} layers, {} heads, width {}, context {}, vocab {} (padded {})", n_layer,
                     n_head, d_model, max_seq_len, vocab_size, padded_vocab);
}

GPT2Config GPT2Config::preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      GPT2Config c;
      c.n_layer = p.n_layer;
      c.n_head = p.n_head;
      c.d_model = p.d_model;
      c.max_seq_len = p.max_seq_len;
      c.vocab_size = p.vocab_size;
      c.finalize();
      return c;
    }
  }
  MEMFIT_THROW(ConfigError, "config", "unknown model preset '{}'; known: {}", name,
               fmt::join(preset_names(), ", "));
}

std::vector<std::string> GPT2Config::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace memfit
