// A save's quantized base (--base-dtype nf4 or int8; Note [NF4 weights], "QLoRA", and Note
// [Int8 weights]): the blocks' linear weights exactly as the run held them, the quantized bytes
// of each matrix (model/quant_base.h), so that --resume reads them back instead of quantizing
// the save's dequantized model.safetensors again (for NF4 that would not give the same bytes:
// the second level's offset is the mean of the absmax it quantizes; for int8 it is not the
// identity either where a row's absmax does not survive the round trip).
#pragma once

#include <filesystem>
#include <string>

#include "memfit/memory/tensor.h"
#include "memfit/model/quant_base.h"

namespace memfit::io {

// "base_nf4.safetensors", "base_int8.safetensors".
std::string quant_base_file(kernels::WeightQuant format);

// Writes `buffer` (the model's quantized base, laid out by `layout`) to `file`: one U8 tensor
// per matrix, "model.layers.<l>.<slot>.<format>" (slot qkv, attn_out, fc, mlp_out), its
// (rows, cols) in the metadata.
void save_quant_base(const std::filesystem::path& file, const QuantBaseLayout& layout,
                     const Tensor& buffer);
// Reads such a file into `buffer`, byte for byte; IoError naming the file and tensor where a
// matrix is missing or its size or shape differs from this model's.
void load_quant_base(const std::filesystem::path& file, const QuantBaseLayout& layout,
                     const Tensor& buffer);

}  // namespace memfit::io
