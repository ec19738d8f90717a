// GPT-2 weights and optimizer state in Hugging Face's layout, and the checkpoint directory that
// holds them. Loading checks everything first and copies second, so a refused checkpoint leaves
// the model and optimizer as they were. See docs/notes/checkpoints.md.
#include "memfit/io/gpt2_checkpoint.h"

#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/safetensors.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kPrefix = "transformer.";
constexpr size_t kMismatchesShown = 8;

std::string join_mismatches(const std::vector<std::string>& m) {
  std::string s;
  for (size_t i = 0; i < m.size() && i < kMismatchesShown; ++i) s += (i ? "; " : "") + m[i];
  if (m.size() > kMismatchesShown) s += fmt::format("; and {} more", m.size() - kMismatchesShown);
  return s;
}

std::vector<int64_t> dims(const Shape& s) { return {s.begin(), s.end()}; }

bool is_float_stored(SafetensorsDType d) {
  return d == SafetensorsDType::F32 || d == SafetensorsDType::BF16 || d == SafetensorsDType::F16;
}

// Hugging Face GPT-2 keeps the causal mask as buffers "h.N.attn.bias" / "h.N.attn.masked_bias";
// older saves include them. They are not parameters.
bool is_attention_buffer(std::string_view key) {
  auto ends_with = [&](std::string_view s) {
    return key.size() >= s.size() && key.substr(key.size() - s.size()) == s;
  };
  return key.rfind("h.", 0) == 0 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"));
}

// A tensor to copy: validated, not yet copied.
struct Copy {
  const SafetensorsEntry* entry;
  Tensor dst;
  bool transpose;
};

// Matches the file's tensors to the layout; throws listing mismatches, else returns the copies.
// The shape Hugging Face stores a parameter in.
std::vector<int64_t> hf_shape(const ParamInfo& p, const ModelConfig& config) {
  std::vector<int64_t> want = dims(p.shape);
  if (p.role == ParamRole::token_embedding) want[0] = config.vocab_size;  // no padding rows
  if (gpt2_is_conv1d(p)) std::swap(want[0], want[1]);
  return want;
}

// Matches the file's tensors to the layout; throws listing mismatches (in layout order, then
// unexpected tensors), else returns the copies to make.
std::vector<Copy> plan_weights(const SafetensorsReader& reader, const ModelConfig& config,
                               const ParamLayout& layout, const Tensor& slab) {
  std::map<std::string, const ParamInfo*> expected;
  for (const ParamInfo& p : layout.params()) expected[p.name] = &p;
  std::map<std::string, const SafetensorsEntry*> found;  // key without prefix -> entry
  std::vector<std::string> mismatches, unexpected;
  const SafetensorsEntry* lm_head = nullptr;
  const SafetensorsDType slab_type = safetensors_dtype_of(slab.dtype());
  const bool converts = slab_type == SafetensorsDType::F32 || slab_type == SafetensorsDType::BF16;

  for (const SafetensorsEntry& e : reader.entries()) {
    std::string key = e.name.rfind(kPrefix, 0) == 0 ? e.name.substr(kPrefix.size()) : e.name;
    if (e.name == "lm_head.weight") {
      lm_head = &e;
    } else if (is_attention_buffer(key)) {
      continue;
    } else if (!expected.count(key)) {
      unexpected.push_back(fmt::format("unexpected '{}' {}", e.name, format_shape(e.shape)));
    } else if (!found.emplace(key, &e).second) {
      unexpected.push_back(
          fmt::format("'{}' appears both with and without the '{}' prefix", key, kPrefix));
    }
  }
  for (const ParamInfo& p : layout.params()) {
    std::vector<int64_t> want = hf_shape(p, config);
    auto it = found.find(p.name);
    if (it == found.end()) {
      mismatches.push_back(fmt::format("missing '{}' {}", gpt2_hf_name(p), format_shape(want)));
      continue;
    }
    const SafetensorsEntry& e = *it->second;
    if (e.shape != want)
      mismatches.push_back(fmt::format("'{}' has shape {}, expected {}", e.name,
                                       format_shape(e.shape), format_shape(want)));
    if (!is_float_stored(e.dtype) || (!converts && e.dtype != slab_type))
      mismatches.push_back(fmt::format("'{}' is stored as {}, which cannot load into a {} model",
                                       e.name, safetensors_dtype_name(e.dtype),
                                       dtype_name(slab.dtype())));
  }
  mismatches.insert(mismatches.end(), unexpected.begin(), unexpected.end());
  // memfit ties the LM head to wte; an untied checkpoint would load as a different model.
  if (lm_head && found.count("wte.weight")) {
    const SafetensorsEntry& wte = *found["wte.weight"];
    if (lm_head->shape != wte.shape || lm_head->dtype != wte.dtype ||
        std::memcmp(reader.bytes(*lm_head), reader.bytes(wte), wte.nbytes()) != 0)
      mismatches.push_back(fmt::format(
          "'lm_head.weight' differs from '{}': memfit ties the two, so an untied checkpoint "
          "cannot be loaded",
          wte.name));
  }
  if (!mismatches.empty())
    MEMFIT_THROW(IoError, "checkpoint",
                 "{}: the checkpoint does not match the model ({}): {} mismatch{}: {}",
                 reader.path().string(), config.describe(), mismatches.size(),
                 mismatches.size() == 1 ? "" : "es", join_mismatches(mismatches));

  std::vector<Copy> copies;
  for (const ParamInfo& p : layout.params()) {
    Tensor dst = layout.view(slab, p);
    if (p.role == ParamRole::token_embedding) dst = dst.slice(0, config.vocab_size);
    copies.push_back({found.at(p.name), dst, gpt2_is_conv1d(p)});
  }
  return copies;
}

void copy_all(const SafetensorsReader& reader, const std::vector<Copy>& copies) {
  for (const Copy& c : copies) reader.read(*c.entry, c.dst, c.transpose);
}

void zero_wte_padding(const ModelConfig& config, const ParamLayout& layout, const Tensor& slab) {
  Tensor wte = layout.view(slab, "wte.weight");
  if (config.padded_vocab > config.vocab_size)
    wte.slice(config.vocab_size, config.padded_vocab).zero();
}

std::string state_name(Optimizer& opt, const std::string& name) {
  std::string prefix = opt.name() + ".";
  return name.rfind(prefix, 0) == 0 ? name : prefix + name;
}

struct OptimizerPlan {
  std::vector<Copy> copies;
  int64_t steps = 0;
};

OptimizerPlan plan_optimizer(const SafetensorsReader& reader, Optimizer& opt) {
  const std::string file = reader.path().string();
  auto meta = [&](const char* key) -> const std::string& {
    auto it = reader.metadata().find(key);
    if (it == reader.metadata().end())
      MEMFIT_THROW(IoError, "checkpoint", "{}: metadata has no \"{}\"", file, key);
    return it->second;
  };
  const std::string& name = meta("optimizer");
  if (name != opt.name())
    MEMFIT_THROW(IoError, "checkpoint", "{}: holds '{}' optimizer state; this run uses '{}'", file,
                 name, opt.name());
  OptimizerPlan plan;
  const std::string& steps = meta("steps_taken");
  auto [end, ec] = std::from_chars(steps.data(), steps.data() + steps.size(), plan.steps);
  if (ec != std::errc() || end != steps.data() + steps.size() || plan.steps < 0)
    MEMFIT_THROW(IoError, "checkpoint", "{}: steps_taken '{}' is not a non-negative integer", file,
                 steps);

  std::vector<std::string> mismatches;
  std::map<std::string, bool> used;
  for (const SafetensorsEntry& e : reader.entries()) used[e.name] = false;
  for (auto& [n, t] : opt.state()) {
    std::string key = state_name(opt, n);
    const SafetensorsEntry* e = reader.find(key);
    if (!e) {
      mismatches.push_back(fmt::format("missing '{}' {} {}", key,
                                       safetensors_dtype_name(safetensors_dtype_of(t.dtype())),
                                       t.shape()));
      continue;
    }
    used[key] = true;
    std::vector<int64_t> want = dims(t.shape());
    SafetensorsDType type = safetensors_dtype_of(t.dtype());
    if (e->shape != want || e->dtype != type) {
      mismatches.push_back(fmt::format("'{}' is {} {}, expected {} {}", key,
                                       safetensors_dtype_name(e->dtype), format_shape(e->shape),
                                       safetensors_dtype_name(type), format_shape(want)));
      continue;
    }
    plan.copies.push_back({e, t, false});
  }
  for (auto& [n, u] : used)
    if (!u) mismatches.push_back(fmt::format("unexpected '{}'", n));
  if (!mismatches.empty())
    MEMFIT_THROW(IoError, "checkpoint",
                 "{}: the optimizer state does not match this '{}' optimizer: {} mismatch{}: {}",
                 file, opt.name(), mismatches.size(), mismatches.size() == 1 ? "" : "es",
                 join_mismatches(mismatches));
  return plan;
}

// Pointers for a model directory that has no model.safetensors.
std::string why_no_model(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors.index.json", ec))
    return " (sharded checkpoints, model.safetensors.index.json, are not supported)";
  if (fs::exists(dir / "pytorch_model.bin", ec))
    return " (pytorch_model.bin is a pickle, which memfit does not read; convert it to "
           "safetensors)";
  return "";
}

}  // namespace

std::string gpt2_hf_name(const ParamInfo& p) { return std::string(kPrefix) + p.name; }

bool gpt2_is_conv1d(const ParamInfo& p) {
  return p.role == ParamRole::attn_qkv_weight || p.role == ParamRole::attn_proj_weight ||
         p.role == ParamRole::mlp_fc_weight || p.role == ParamRole::mlp_proj_weight;
}

void save_gpt2_weights(const fs::path& file, const ModelConfig& config, const ParamLayout& layout,
                       const Tensor& slab) {
  SafetensorsWriter writer;
  for (const ParamInfo& p : layout.params()) {
    Tensor t = layout.view(slab, p);
    if (p.role == ParamRole::token_embedding) t = t.slice(0, config.vocab_size);
    writer.add(gpt2_hf_name(p), t, std::nullopt, gpt2_is_conv1d(p));
  }
  writer.set_metadata("format", "pt");
  writer.write(file);
}

void load_gpt2_weights(const fs::path& file, const ModelConfig& config, const ParamLayout& layout,
                       Tensor& slab) {
  SafetensorsReader reader(file);
  std::vector<Copy> copies = plan_weights(reader, config, layout, slab);
  copy_all(reader, copies);
  zero_wte_padding(config, layout, slab);
}

void save_optimizer_state(const fs::path& file, Optimizer& optimizer) {
  SafetensorsWriter writer;
  for (auto& [n, t] : optimizer.state()) writer.add(state_name(optimizer, n), t);
  writer.set_metadata("format", "pt");
  writer.set_metadata("optimizer", optimizer.name());
  writer.set_metadata("steps_taken", std::to_string(optimizer.steps_taken()));
  writer.write(file);
}

void load_optimizer_state(const fs::path& file, Optimizer& optimizer) {
  SafetensorsReader reader(file);
  OptimizerPlan plan = plan_optimizer(reader, optimizer);
  copy_all(reader, plan.copies);
  optimizer.set_steps_taken(plan.steps);
}

void save_gpt2_checkpoint(const fs::path& dir, const ModelConfig& config, const ParamLayout& layout,
                          const Tensor& slab, const CheckpointSaveOptions& options) {
  for (const auto& [name, contents] : options.extra_files) {
    MEMFIT_CHECK(!name.empty() && name != "." && name != ".." &&
                     name.find('/') == std::string::npos && name != kModelFile &&
                     name != kConfigFile && name != kOptimizerFile,
                 "checkpoint", "'{}' cannot name an extra checkpoint file", name);
  }
  write_directory_atomic(
      dir,
      [&](const fs::path& tmp) {
        save_gpt2_weights(tmp / kModelFile, config, layout, slab);
        if (options.on_stage) options.on_stage(SaveStage::model_written);
        write_file_atomic(tmp / kConfigFile,
                          gpt2_config_to_hf_json(config, slab.dtype()).dump(2) + "\n");
        if (options.optimizer) save_optimizer_state(tmp / kOptimizerFile, *options.optimizer);
        for (const auto& [name, contents] : options.extra_files)
          write_file_atomic(tmp / name, contents);
        if (options.write_extra) options.write_extra(tmp);
      },
      options.on_stage, kModelFile);
}

CheckpointLocation load_gpt2_checkpoint(const fs::path& dir, const ModelConfig& config,
                                        const ParamLayout& layout, Tensor& slab,
                                        Optimizer* optimizer) {
  CheckpointLocation where = locate_checkpoint(dir);
  const fs::path config_path = where.dir / kConfigFile;
  ModelConfig saved = read_gpt2_config(config_path);
  std::vector<std::string> diffs;
  auto same = [&](const char* field, int a, int b) {
    if (a != b) diffs.push_back(fmt::format("{} is {} there, {} here", field, a, b));
  };
  same("n_layer", saved.n_layer, config.n_layer);
  same("n_head", saved.n_head, config.n_head);
  same("n_embd", saved.d_model, config.d_model);
  same("n_positions", saved.max_seq_len, config.max_seq_len);
  same("vocab_size", saved.vocab_size, config.vocab_size);
  if (!diffs.empty())
    MEMFIT_THROW(IoError, "checkpoint", "{}: the checkpoint is for another model: {}",
                 config_path.string(), join_mismatches(diffs));

  const fs::path model_path = where.dir / kModelFile;
  std::error_code ec;
  if (!fs::exists(model_path, ec))
    MEMFIT_THROW(IoError, "checkpoint", "{}: no {}{}", where.dir.string(), kModelFile,
                 why_no_model(where.dir));
  SafetensorsReader model(model_path);
  std::vector<Copy> weights = plan_weights(model, config, layout, slab);
  std::optional<SafetensorsReader> opt_reader;
  OptimizerPlan opt_plan;
  if (optimizer) {
    const fs::path opt_path = where.dir / kOptimizerFile;
    if (!fs::exists(opt_path, ec))
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: no {}, so the optimizer cannot resume (load the "
                   "weights alone to start a fresh optimizer)",
                   where.dir.string(), kOptimizerFile);
    opt_reader.emplace(opt_path);
    opt_plan = plan_optimizer(*opt_reader, *optimizer);
  }
  // Everything fits: now copy.
  copy_all(model, weights);
  zero_wte_padding(config, layout, slab);
  if (optimizer) {
    copy_all(*opt_reader, opt_plan.copies);
    optimizer->set_steps_taken(opt_plan.steps);
  }
  return where;
}

}  // namespace memfit::io
