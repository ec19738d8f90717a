#include "memfit/model/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/core/error.h"
#include "memfit/model/model_family.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/vocab_shard.h"

namespace memfit {

std::string_view family_name(Family family) { return model_family(family).name; }

int64_t ModelConfig::fc_width() const {
  return model_family(family).fc_matrices * int64_t{local_ffn()};
}

int64_t ModelConfig::local_vocab() const {
  return tp == 1 ? padded_vocab : vocab_shard(vocab_size, tp, 0, kVocabPadMultiple).width;
}

void ModelConfig::set_tensor_parallel(int T) {
  if (T < 1) MEMFIT_THROW(ConfigError, "config", "--tp must be positive, got {}", T);
  auto divides = [T](int n, const char* what) {
    if (n % T != 0)
      MEMFIT_THROW(ConfigError, "config",
                   "--tp {} must divide the model's {} ({}): each tensor rank holds 1/{} of them",
                   T, what, n, T);
  };
  divides(n_head, "attention heads (n_head)");
  // Fewer key/value heads than ranks: each replicated on T / n_kv_head ranks (Note [Tensor
  // parallel], "Grouped-query attention").
  if (n_kv_head % T != 0 && T % n_kv_head != 0)
    MEMFIT_THROW(ConfigError, "config",
                 "--tp {} must divide the model's key/value heads (n_kv_head {}) or be a multiple "
                 "of them (each then replicated on --tp / n_kv_head ranks)",
                 T, n_kv_head);
  divides(ffn_dim, "MLP width (ffn_dim)");
  tp = T;
}

void ModelConfig::set_pipeline_stage(const PipelineStage& s) {
  if (s.stages <= 1) {
    stage = PipelineStage{};
    return;
  }
  if (s.index < 0 || s.index >= s.stages || s.first < 0 || s.first >= s.last ||
      s.last > n_layer || (s.index == 0) != (s.first == 0) ||
      (s.index + 1 == s.stages) != (s.last == n_layer))
    MEMFIT_THROW(ConfigError, "config",
                 "--pp {}: stage {} with blocks [{}, {}) does not cut a model of {} blocks",
                 s.stages, s.index, s.first, s.last, n_layer);
  stage = s;
}

namespace {

ModelConfig gpt2_preset(int n_layer, int n_head, int d_model, int max_seq_len, int vocab) {
  ModelConfig c;
  c.n_layer = n_layer, c.n_head = n_head, c.d_model = d_model;
  c.max_seq_len = max_seq_len, c.vocab_size = vocab;
  return c;
}

ModelConfig llama_preset(int n_layer, int n_head, int n_kv_head, int d_model, int ffn_dim,
                         int max_seq_len, int vocab, double rope_theta, bool tied) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = n_layer, c.n_head = n_head, c.n_kv_head = n_kv_head, c.d_model = d_model;
  c.ffn_dim = ffn_dim, c.max_seq_len = max_seq_len, c.vocab_size = vocab;
  c.rope_theta = rope_theta, c.tie_embeddings = tied;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig config;
};

// gpt2-tiny and llama-tiny are for tests (~0.3M parameters); gpt2-small-test is the 6-layer,
// 384-wide shape the benchmarks compare with PyTorch; the rest are the published shapes
// (Hugging Face config.json of openai-community/gpt2*, TinyLlama/TinyLlama-1.1B-*,
// meta-llama/Llama-3.2-1B, meta-llama/Llama-2-7b-hf, meta-llama/Meta-Llama-3-8B,
// meta-llama/Meta-Llama-3-70B, meta-llama/Llama-3.1-405B; the 405B's context and rope scaling
// as Llama 3.1's: 131,072 positions, the 8192-position base scaled by 8).
const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = [] {
    ModelConfig llama32 = llama_preset(16, 32, 8, 2048, 8192, 131072, 128256, 500000, true);
    llama32.rope_scaling = {32, 1, 4, 8192};
    ModelConfig llama31_405b =
        llama_preset(126, 128, 8, 16384, 53248, 131072, 128256, 500000, false);
    llama31_405b.rope_scaling = {8, 1, 4, 8192};
    return std::vector<Preset>{
        {"gpt2-tiny", gpt2_preset(2, 4, 96, 64, 512)},
        {"gpt2-small-test", gpt2_preset(6, 6, 384, 256, 50257)},
        {"gpt2", gpt2_preset(12, 12, 768, 1024, 50257)},
        {"gpt2-medium", gpt2_preset(24, 16, 1024, 1024, 50257)},
        {"gpt2-large", gpt2_preset(36, 20, 1280, 1024, 50257)},
        {"gpt2-xl", gpt2_preset(48, 25, 1600, 1024, 50257)},
        {"llama-tiny", llama_preset(2, 4, 2, 96, 256, 64, 512, 10000, false)},
        {"tinyllama-1.1b", llama_preset(22, 32, 4, 2048, 5632, 2048, 32000, 10000, false)},
        {"llama3.2-1b", llama32},
        {"llama2-7b", llama_preset(32, 32, 32, 4096, 11008, 4096, 32000, 10000, false)},
        {"llama3-8b", llama_preset(32, 32, 8, 4096, 14336, 8192, 128256, 500000, false)},
        {"llama3-70b", llama_preset(80, 64, 8, 8192, 28672, 8192, 128256, 500000, false)},
        {"llama3.1-405b", llama31_405b},
    };
  }();
  return kPresets;
}

}  // namespace

void ModelConfig::finalize() {
  auto positive = [](int v, const char* field) {
    if (v <= 0) MEMFIT_THROW(ConfigError, "config", "{} must be positive, got {}", field, v);
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(d_model, "d_model");
  positive(max_seq_len, "seq_len");
  positive(vocab_size, "vocab");
  // Far beyond any published model, and low enough that the products of these sizes the
  // kernels and the planner form (4 d_model, a row's 3 d_model, the rows of a table) stay in
  // their integers.
  auto at_most = [](int v, const char* field, int most) {
    if (v > most)
      MEMFIT_THROW(ConfigError, "config", "{} must be at most {}, got {}", field, most, v);
  };
  constexpr int kMaxLayers = 1 << 16, kMaxSize = 1 << 24;
  at_most(n_layer, "n_layer", kMaxLayers);
  at_most(n_head, "n_head", kMaxSize);
  at_most(d_model, "d_model", kMaxSize);
  at_most(max_seq_len, "seq_len", kMaxSize);
  at_most(vocab_size, "vocab", kMaxSize);
  at_most(ffn_dim, "ffn_dim", kMaxSize);
  if (d_model % n_head != 0)
    MEMFIT_THROW(ConfigError, "config", "d_model {} is not a multiple of n_head {}", d_model,
                 n_head);
  model_family(family).fix_shape(*this);  // GPT-2's MLP width, heads and tied head
  if (n_kv_head == 0) n_kv_head = n_head;
  positive(ffn_dim, "ffn_dim");
  if (n_kv_head < 0 || n_head % n_kv_head != 0)
    MEMFIT_THROW(ConfigError, "config", "n_kv_head {} must divide n_head {}", n_kv_head, n_head);
  if (model_family(family).rotary && head_size() % 2 != 0)
    MEMFIT_THROW(ConfigError, "config",
                 "rotary embeddings need an even head size; d_model {} / n_head {} = {}", d_model,
                 n_head, head_size());
  if (!(norm_eps > 0)) MEMFIT_THROW(ConfigError, "config", "norm_eps must be positive");
  if (!(rope_theta > 0)) MEMFIT_THROW(ConfigError, "config", "rope_theta must be positive");
  padded_vocab = (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
}

int64_t ModelConfig::num_params() const { return ParamLayout(*this).total(); }

std::string ModelConfig::describe() const { return model_family(family).describe(*this); }

ModelConfig ModelConfig::preset(std::string_view name) {
  for (const Preset& p : presets()) {
    if (name == p.name) {
      ModelConfig c = p.config;
      c.finalize();
      return c;
    }
  }
  MEMFIT_THROW(ConfigError, "config", "unknown model preset '{}'; known: {}", name,
               fmt::join(preset_names(), ", "));
}

std::vector<std::string> ModelConfig::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.emplace_back(p.name);
  return names;
}

}  // namespace memfit
