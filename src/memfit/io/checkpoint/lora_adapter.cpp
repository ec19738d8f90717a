#include "memfit/io/checkpoint/lora_adapter.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/model/model_family.h"
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
          {"fan_in_fan_out", model_family(model.family).hf_transposed},
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

bool has_lora_adapter(const fs::path& dir) { return fs::exists(dir / kAdapterConfigFile); }

LoraOptions read_lora_options(const fs::path& dir, const ModelConfig& model) {
  const fs::path file = dir / kAdapterConfigFile;
  if (!fs::exists(file)) MEMFIT_THROW(IoError, "lora", "{}: no {}", dir.string(), kAdapterConfigFile);
  const json got = json::parse(read_file_to_string(file), nullptr, false);
  if (!got.is_object()) MEMFIT_THROW(IoError, "lora", "{}: not a JSON object", file.string());
  auto field = [&](const char* key) -> const json& {
    if (!got.contains(key)) MEMFIT_THROW(IoError, "lora", "{}: no {}", file.string(), key);
    return got[key];
  };
  if (got.contains("peft_type") && got["peft_type"] != "LORA")
    MEMFIT_THROW(IoError, "lora", "{}: peft_type is {}, not LORA", file.string(),
                 got["peft_type"].dump());
  // PEFT's variants that change what the adapters compute: refused rather than misread.
  for (const char* key : {"use_rslora", "use_dora"})
    if (got.contains(key) && got[key] == true)
      MEMFIT_THROW(IoError, "lora", "{}: {} is true; memfit builds plain LoRA only", file.string(),
                   key);
  for (const char* key : {"rank_pattern", "alpha_pattern", "layers_to_transform"})
    if (got.contains(key) && !got[key].is_null() && !got[key].empty())
      MEMFIT_THROW(IoError, "lora", "{}: {} is {}; memfit builds one rank and alpha on every "
                   "layer", file.string(), key, got[key].dump());
  if (got.contains("bias") && got["bias"] != "none")
    MEMFIT_THROW(IoError, "lora", "{}: bias is {}; memfit builds bias \"none\"", file.string(),
                 got["bias"].dump());
  const json& r = field("r");
  const json& alpha = field("lora_alpha");
  const json& modules = field("target_modules");
  if (!r.is_number_integer() || !alpha.is_number())
    MEMFIT_THROW(IoError, "lora", "{}: r must be an integer and lora_alpha a number, got {} and {}",
                 file.string(), r.dump(), alpha.dump());
  LoraOptions o;
  o.rank = r.get<int>();
  o.alpha = alpha.get<float>();
  if (modules == "all-linear") {
    o.targets = "all-linear";
  } else if (modules.is_array() && std::all_of(modules.begin(), modules.end(),
                                               [](const json& m) { return m.is_string(); })) {
    try {
      o.targets = lora_targets_from_modules(modules.get<std::vector<std::string>>(), model.family);
    } catch (const ConfigError& e) {
      MEMFIT_THROW(IoError, "lora", "{}: target_modules: {}", file.string(), e.what());
    }
  } else {
    MEMFIT_THROW(IoError, "lora", "{}: target_modules is {}; memfit reads a list of module "
                 "names (a regular expression is not built)", file.string(), modules.dump());
  }
  return o;
}

void load_lora_adapter(const fs::path& dir, const ModelConfig& model, const LoraLayout& layout,
                       const Tensor& slab) {
  MEMFIT_CHECK_SHAPE(slab.numel() == layout.total() && slab.dtype() == DType::f32, "lora",
                     "an adapter slab of {} f32 elements, got {}", layout.total(), slab.numel());
  const LoraOptions got = read_lora_options(dir, model);
  const LoraOptions& want = layout.options();
  const fs::path config_file = dir / kAdapterConfigFile;
  if (got.rank != want.rank)
    MEMFIT_THROW(IoError, "lora", "{}: r is {}, this run's adapters have {}",
                 config_file.string(), got.rank, want.rank);
  if (got.alpha != want.alpha)
    MEMFIT_THROW(IoError, "lora", "{}: lora_alpha is {}, this run's adapters have {}",
                 config_file.string(), got.alpha, want.alpha);
  if (lora_chosen_targets(got, model.family) != lora_chosen_targets(want, model.family))
    MEMFIT_THROW(IoError, "lora", "{}: target_modules are {} ({}), this run's adapters have {}",
                 config_file.string(), got.targets,
                 adapter_config(model, LoraLayout(model, got))["target_modules"].dump(),
                 want.targets);
  SafetensorsReader r(dir / kAdapterModelFile);
  for (const ParamInfo& p : layout.param_layout().params())
    r.read(peft_adapter_name(p.name), slab.view(p.offset, p.shape));
}

void refuse_lora_checkpoint(const fs::path& dir, const char* command) {
  if (!has_lora_adapter(dir)) return;
  MEMFIT_THROW(ConfigError, command,
               "{} holds LoRA adapters ({}) beside its base weights; without --merge-lora "
               "memfit {} would write the base model alone: --merge-lora writes the merged model "
               "(each adapted weight W + (alpha/r) B A; Note [LoRA], docs/notes/lora.md)",
               dir.string(), kAdapterModelFile, command);
}

}  // namespace memfit::io
