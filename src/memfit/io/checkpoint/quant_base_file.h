// A QLoRA save's NF4 base (Note [NF4 weights], "QLoRA"): the blocks' linear weights exactly as
// the run held them, the NF4 bytes of each matrix (model/nf4_base.h), so that --resume reads
// them back instead of quantizing the save's dequantized model.safetensors again (which would
// not give the same bytes: the second level's offset is the mean of the absmax it quantizes).
#pragma once

#include <filesystem>

#include "memfit/memory/tensor.h"
#include "memfit/model/nf4_base.h"

namespace memfit::io {

inline constexpr const char* kNf4BaseFile = "base_nf4.safetensors";

// Writes `buffer` (the model's NF4 base, laid out by `layout`) to `file`: one U8 tensor per
// matrix, "model.layers.<l>.<slot>.nf4" (slot qkv, attn_out, fc, mlp_out), its (rows, cols)
// in the metadata.
void save_nf4_base(const std::filesystem::path& file, const Nf4BaseLayout& layout,
                   const Tensor& buffer);
// Reads such a file into `buffer`, byte for byte; IoError naming the file and tensor where a
// matrix is missing or its size or shape differs from this model's.
void load_nf4_base(const std::filesystem::path& file, const Nf4BaseLayout& layout,
                   const Tensor& buffer);

}  // namespace memfit::io
