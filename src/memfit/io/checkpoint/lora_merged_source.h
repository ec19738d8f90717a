// `memfit export --merge-lora`: a LoRA save read as the merged model. It wraps the save's base
// weights (a ParamSource) and hands out each adapted parameter as W + (alpha / r) B A
// (model/lora_merge.h), so export_hf writes the merged model one tensor at a time, holding the
// adapters (small) and one parameter. Note [LoRA] in docs/notes/lora.md.
#pragma once

#include <filesystem>
#include <memory>

#include "memfit/io/checkpoint/checkpoint_export.h"

namespace memfit::io {

// `base` (the save's weights) with the adapters of `adapter_dir` (PEFT's files: its r,
// lora_alpha and target_modules) merged in. The adapter slab comes from `pool`
// (Category::staging, "export.lora"). IoError for a directory without adapters or whose
// adapters do not fit the model.
std::unique_ptr<ParamSource> make_lora_merged_source(std::unique_ptr<ParamSource> base,
                                                     const std::filesystem::path& adapter_dir,
                                                     MemoryPool& pool);

}  // namespace memfit::io
