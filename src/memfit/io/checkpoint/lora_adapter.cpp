#include "memfit/io/checkpoint/lora_adapter.h"

#include <set>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/safetensors.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// PEFT's target_modules, each once, in order: the module names after the block's index
// ("self_attn.q_proj", "attn.c_proj"), which PEFT matches as suffixes, so GPT-2's attn.c_proj
// and mlp.c_proj stay apart (a bare "c_proj" would adapt both).
json target_modules(const LoraLayout& layout) {
  json out = json::array();
  std::set<std::string> seen;
  for (const LoraParam& p : layout.params()) {
    const size_t layer_dot = p.module.find('.', p.module.find(".h.") != std::string::npos
                                                    ? p.module.find(".h.") + 3
                                                    : p.module.find(".layers.") + 8);
    const std::string last = p.module.substr(layer_dot + 1);
    if (seen.insert(last).second) out.push_back(last);
  }
  return out;
}

json adapter_config(const ModelConfig& model, const LoraLayout& layout) {
  const LoraOptions& o = layout.options();
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"r", o.rank},
          {"lora_alpha", o.alpha},
          {"lora_dropout", o.dropout},
          {"target_modules", target_modules(layout)},
          // GPT-2's layers are Conv1D, whose weight is stored (in, out): PEFT then sets this.
          {"fan_in_fan_out", model.family == Family::gpt2},
          {"bias", "none"},
          {"inference_mode", true},
          {"base_model_name_or_path", nullptr},
          {"modules_to_save", nullptr}};
}

}  // namespace

std::string peft_adapter_name(const std::string& adapter_param) {
  return "base_model.model." + adapter_param;
}

void save_lora_adapter(const fs::path& dir, const ModelConfig& model, const LoraLayout& layout,
                       const Tensor& slab) {
  MEMFIT_CHECK_SHAPE(slab.numel() == layout.total() && slab.dtype() == DType::f32, "lora",
                     "an adapter slab of {} f32 elements, got {}", layout.total(), slab.numel());
  fs::create_directories(dir);
  SafetensorsWriter w;
  for (const ParamInfo& p : layout.param_layout().params())
    w.add(peft_adapter_name(p.name), slab.view(p.offset, p.shape));
  w.set_metadata("format", "pt");
  w.write(dir / kAdapterModelFile);
  write_file_atomic(dir / kAdapterConfigFile, adapter_config(model, layout).dump(2) + "\n");
}

void load_lora_adapter(const fs::path& dir, const ModelConfig& model, const LoraLayout& layout,
                       const Tensor& slab) {
  MEMFIT_CHECK_SHAPE(slab.numel() == layout.total() && slab.dtype() == DType::f32, "lora",
                     "an adapter slab of {} f32 elements, got {}", layout.total(), slab.numel());
  const fs::path config_file = dir / kAdapterConfigFile;
  if (!fs::exists(config_file))
    MEMFIT_THROW(IoError, "lora", "{}: no {}", dir.string(), kAdapterConfigFile);
  const json got = json::parse(read_file_to_string(config_file), nullptr, false);
  const json want = adapter_config(model, layout);
  for (const char* key : {"r", "lora_alpha", "target_modules"})
    if (!got.is_object() || !got.contains(key) || got[key] != want[key])
      MEMFIT_THROW(IoError, "lora", "{}: {} is {}, this run's adapters have {}",
                   config_file.string(), key,
                   got.is_object() && got.contains(key) ? got[key].dump() : "missing",
                   want[key].dump());
  SafetensorsReader r(dir / kAdapterModelFile);
  for (const ParamInfo& p : layout.param_layout().params())
    r.read(peft_adapter_name(p.name), slab.view(p.offset, p.shape));
}

void refuse_lora_checkpoint(const fs::path& dir, const char* command) {
  if (!fs::exists(dir / kAdapterConfigFile)) return;
  MEMFIT_THROW(ConfigError, command,
               "{} holds LoRA adapters ({}) beside its base weights; memfit {} would use the "
               "base model alone, and applying or merging the adapters is not built yet "
               "(Note [LoRA], docs/notes/lora.md)",
               dir.string(), kAdapterModelFile, command);
}

}  // namespace memfit::io
