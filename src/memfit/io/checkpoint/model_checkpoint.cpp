// Optimizer state and the checkpoint directory that holds it with the weights and config.json.
// Loading checks everything first and copies second, so a refused checkpoint leaves the model
// and optimizer as they were. See docs/notes/checkpoints.md.
#include "memfit/io/checkpoint/model_checkpoint.h"

#include "memfit/io/checkpoint/checkpoint_export.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/kernels/cpu/convert.h"

#include <charconv>
#include <map>
#include <optional>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/safetensors.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<int64_t> dims(const Shape& s) { return {s.begin(), s.end()}; }

// A tensor to copy: validated, not yet copied.
struct Copy {
  const SafetensorsEntry* entry;
  Tensor dst;
};

void copy_all(const SafetensorsReader& reader, const std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    reader.read(*c.entry, c.dst);
    reader.release(*c.entry);
  }
}

std::string state_name(Optimizer& opt, const std::string& name) {
  return optimizer_state_key(opt.name(), name);
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
    plan.copies.push_back({e, t});
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

// Pointers for a model directory that has no safetensors weights.
std::string why_no_model(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "pytorch_model.bin", ec) ||
      fs::exists(dir / "pytorch_model.bin.index.json", ec))
    return " (pytorch_model.bin is a pickle, which memfit does not read; convert it to "
           "safetensors)";
  return "";
}

bool is_shard_name(const std::string& name) {
  return name.rfind("model-", 0) == 0 && name.size() > 12 &&
         name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// A name an extra file may take: one plain file name that is none of the checkpoint's own.
bool is_extra_file_name(std::string_view name) {
  for (std::string_view own : {kModelFile, kModelIndexFile, kConfigFile, kOptimizerFile})
    if (name == own) return false;
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && !is_shard_name(std::string(name));
}

}  // namespace

// What differs between the saved model and this one, in the family's config.json field names.
std::vector<std::string> config_differences(const ModelConfig& saved, const ModelConfig& c) {
  std::vector<std::string> diffs;
  if (saved.family != c.family) {
    diffs.push_back(fmt::format("the model is {} there, {} here", family_name(saved.family),
                                family_name(c.family)));
    return diffs;
  }
  auto same = [&](const char* field, const auto& a, const auto& b) {
    if (a != b) diffs.push_back(fmt::format("{} is {} there, {} here", field, a, b));
  };
  switch (c.family) {
    case Family::gpt2:
      same("n_layer", saved.n_layer, c.n_layer);
      same("n_head", saved.n_head, c.n_head);
      same("n_embd", saved.d_model, c.d_model);
      same("n_positions", saved.max_seq_len, c.max_seq_len);
      same("vocab_size", saved.vocab_size, c.vocab_size);
      break;
    case Family::llama:
      same("num_hidden_layers", saved.n_layer, c.n_layer);
      same("num_attention_heads", saved.n_head, c.n_head);
      same("num_key_value_heads", saved.n_kv_head, c.n_kv_head);
      same("hidden_size", saved.d_model, c.d_model);
      same("intermediate_size", saved.ffn_dim, c.ffn_dim);
      same("max_position_embeddings", saved.max_seq_len, c.max_seq_len);
      same("vocab_size", saved.vocab_size, c.vocab_size);
      same("tie_word_embeddings", saved.tie_embeddings, c.tie_embeddings);
      same("rms_norm_eps", saved.norm_eps, c.norm_eps);
      same("rope_theta", saved.rope_theta, c.rope_theta);
      if (saved.rope_scaling != c.rope_scaling)
        diffs.push_back(fmt::format("rope_scaling differs (factor {} there, {} here)",
                                    saved.rope_scaling.factor, c.rope_scaling.factor));
      break;
  }
  return diffs;
}

std::string optimizer_state_key(const std::string& optimizer, const std::string& state) {
  std::string prefix = optimizer + ".";
  return state.rfind(prefix, 0) == 0 ? state : prefix + state;
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

// The files that make a directory a checkpoint this code wrote (and may replace).
static constexpr std::initializer_list<std::string_view> kCheckpointMarkers = {
    kModelFile, kModelIndexFile, kZeroIndexFile};

void save_checkpoint(const fs::path& dir, const ModelConfig& config, const ParamLayout& layout,
                     const Tensor& slab, const CheckpointSaveOptions& options) {
  for (const auto& [name, contents] : options.extra_files) {
    MEMFIT_CHECK(is_extra_file_name(name), "checkpoint",
                 "'{}' cannot name an extra checkpoint file", name);
  }
  const int sources = int{slab.defined()} + int{options.sharded_weights_dtype.has_value()} +
                      int{options.streamed_weights.has_value()};
  MEMFIT_CHECK(sources == 1, "checkpoint",
               "save_checkpoint takes a slab of weights, a stream of them, or for a sharded save "
               "their dtype");
  const DType weights_dtype = slab.defined()              ? slab.dtype()
                              : options.streamed_weights ? options.streamed_weights->dtype
                                                         : *options.sharded_weights_dtype;
  WeightsSaveOptions weights;
  weights.max_shard_bytes = options.max_shard_bytes;
  weights.staging_pool = options.staging_pool;
  write_directory_atomic(
      dir,
      [&](const fs::path& tmp) {
        if (slab.defined()) save_weights(tmp, config, layout, slab, weights);
        if (options.streamed_weights)
          save_weights_streamed(tmp, config, layout, *options.streamed_weights, weights);
        if (options.on_stage) options.on_stage(SaveStage::model_written);
        write_file_atomic(tmp / kConfigFile,
                          model_config_to_hf_json(config, weights_dtype).dump(2) + "\n");
        if (options.optimizer) save_optimizer_state(tmp / kOptimizerFile, *options.optimizer);
        for (const auto& [name, contents] : options.extra_files)
          write_file_atomic(tmp / name, contents);
        if (options.write_extra) options.write_extra(tmp);
      },
      options.on_stage, kCheckpointMarkers);
}

void check_checkpoint_writable(const fs::path& dir) {
  check_directory_writable(dir, kCheckpointMarkers);
}

void check_checkpoint_config(const fs::path& dir, const ModelConfig& config) {
  check_checkpoint_config(ReadCheckpoint{dir, read_model_config(dir / kConfigFile)}, config);
}

void check_checkpoint_config(const ReadCheckpoint& saved, const ModelConfig& config) {
  const std::vector<std::string> diffs = config_differences(saved.config, config);
  if (!diffs.empty())
    MEMFIT_THROW(IoError, "checkpoint", "{}: the checkpoint is for another model: {}",
                 (saved.dir / kConfigFile).string(), join_mismatches(diffs));
}

ReadCheckpoint read_checkpoint(const fs::path& dir) {
  ReadCheckpoint r;
  r.dir = locate_checkpoint(dir).dir;
  r.config = read_model_config(r.dir / kConfigFile);
  return r;
}

bool has_model_weights(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kModelFile, ec) || fs::exists(dir / kModelIndexFile, ec);
}

std::string no_weights_hint(const fs::path& dir) { return why_no_model(dir); }

ModelConfig read_checkpoint_config(const fs::path& dir) {
  return read_model_config(locate_checkpoint(dir).dir / kConfigFile);
}

namespace {

// A sharded save's weights into a whole slab, one parameter at a time: straight into an f32
// slab, through one parameter's f32 staging (from a local pool's heap) into a bf16 one.
void load_sharded_weights(const ReadCheckpoint& saved, const ModelConfig& config,
                          const ParamLayout& layout, Tensor& slab) {
  MEMFIT_CHECK(slab.numel() == layout.total(), "checkpoint",
               "the slab has {} elements, the layout {}", slab.numel(), layout.total());
  std::unique_ptr<ParamSource> source = open_checkpoint_weights(saved, config);
  MemoryPool heap;
  for (const ParamInfo& p : layout.params()) {
    const ElementRange r{p.offset, p.offset + p.numel};
    if (slab.dtype() == DType::f32) {
      source->read_range(r, slab.data<float>() + p.offset);
      continue;
    }
    Tensor f32 = Tensor::empty(heap, {p.numel}, DType::f32, Category::staging, "load.param");
    source->read_range(r, f32.data<float>());
    Tensor to = slab.view(p.offset, {p.numel});
    kernels::convert(to, f32);
  }
}

}  // namespace

CheckpointLocation load_checkpoint(const fs::path& dir, const ModelConfig& config,
                                   const ParamLayout& layout, Tensor& slab, Optimizer* optimizer) {
  CheckpointLocation where = locate_checkpoint(dir);
  load_checkpoint(ReadCheckpoint{where.dir, read_model_config(where.dir / kConfigFile)}, config,
                  layout, slab, optimizer);
  return where;
}

void load_checkpoint(const ReadCheckpoint& saved, const ModelConfig& config,
                     const ParamLayout& layout, Tensor& slab, Optimizer* optimizer) {
  const fs::path& dir = saved.dir;
  check_checkpoint_config(saved, config);

  std::error_code ec;
  if (!fs::exists(dir / kModelFile, ec) && !fs::exists(dir / kModelIndexFile, ec)) {
    // A ZeRO-sharded save: the weights are its shard files' ranges (the optimizer's state is
    // sharded too, read with load_optimizer_state_any).
    if (!has_zero_shards(dir))
      MEMFIT_THROW(IoError, "checkpoint", "{}: no {} (nor {}, nor {}){}", dir.string(),
                   kModelFile, kModelIndexFile, kZeroIndexFile, why_no_model(dir));
    if (optimizer)
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: a ZeRO-sharded save (no {}): its optimizer state is in the shard files",
                   dir.string(), kOptimizerFile);
    load_sharded_weights(saved, config, layout, slab);
    return;
  }
  // Check everything (every weights file's header, names, shapes; the optimizer's state)...
  WeightsLoad weights(dir, config, layout, slab);
  std::optional<SafetensorsReader> opt_reader;
  OptimizerPlan opt_plan;
  if (optimizer) {
    const fs::path opt_path = dir / kOptimizerFile;
    if (!fs::exists(opt_path, ec))
      MEMFIT_THROW(IoError, "checkpoint",
                   "{}: no {}, so the optimizer cannot resume (load the "
                   "weights alone to start a fresh optimizer)",
                   dir.string(), kOptimizerFile);
    opt_reader.emplace(opt_path);
    opt_plan = plan_optimizer(*opt_reader, *optimizer);
  }
  // ...then stream it in, one tensor at a time.
  weights.apply();
  if (optimizer) {
    copy_all(*opt_reader, opt_plan.copies);
    optimizer->set_steps_taken(opt_plan.steps);
  }
}

}  // namespace memfit::io
