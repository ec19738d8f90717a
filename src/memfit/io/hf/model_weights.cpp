// Weights in Hugging Face's names and layouts: the per-family naming rules, the streaming save,
// and the load that checks everything before it copies anything. See model_weights.h.
#include "memfit/io/hf/model_weights.h"

#include <fmt/format.h>

#include <cstring>
#include <map>

#include "memfit/core/error.h"
#include "memfit/model/model_family.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

// GPT2LMHeadModel's names put "transformer." before the layout's (the family's hf_prefix).
std::string_view gpt2_prefix() { return model_family(Family::gpt2).hf_prefix; }
constexpr std::string_view kLmHead = "lm_head.weight";
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

bool is_float_stored(SafetensorsDType d) {
  return d == SafetensorsDType::F32 || d == SafetensorsDType::BF16 || d == SafetensorsDType::F16;
}

bool has_vocab_rows(const ParamInfo& p) {
  return p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head;
}

// Buffers, not parameters, that Hugging Face saves have included: GPT-2's causal mask
// ("h.N.attn.bias", "h.N.attn.masked_bias") and older LLaMA saves' rotary inverse frequencies.
bool is_buffer(const ModelConfig& c, std::string_view key) {
  switch (c.family) {
    case Family::gpt2:
      return key.rfind("h.", 0) == 0 &&
             (ends_with(key, ".attn.bias") || ends_with(key, ".attn.masked_bias"));
    case Family::llama: return ends_with(key, ".self_attn.rotary_emb.inv_freq");
  }
  return false;
}

// The layout name a stored name stands for (GPT-2's prefix is optional).
std::string layout_key(const ModelConfig& c, const std::string& name) {
  switch (c.family) {
    case Family::gpt2:
      if (name.rfind(gpt2_prefix(), 0) == 0) return name.substr(gpt2_prefix().size());
      return name;
    case Family::llama: return name;
  }
  return name;
}

// Who ties the head to the embedding, in the error for an untied checkpoint.
const char* tied_by(const ModelConfig& c) {
  switch (c.family) {
    case Family::gpt2: return "memfit";
    case Family::llama: return "this model (tie_word_embeddings true)";
  }
  return "this model";
}

}  // namespace

std::string gpt2_hf_name(const ParamInfo& p) { return std::string(gpt2_prefix()) + p.name; }

bool gpt2_is_conv1d(const ParamInfo& p) {
  return p.role == ParamRole::attn_qkv_weight || p.role == ParamRole::attn_proj_weight ||
         p.role == ParamRole::mlp_fc_weight || p.role == ParamRole::mlp_proj_weight;
}

std::string hf_param_name(const ModelConfig& c, const ParamInfo& p) {
  switch (c.family) {
    case Family::gpt2: return gpt2_hf_name(p);
    case Family::llama: return p.name;  // the layout has Hugging Face's names
  }
  return p.name;
}

bool hf_param_transposed(const ModelConfig& c, const ParamInfo& p) {
  switch (c.family) {
    case Family::gpt2: return gpt2_is_conv1d(p);
    case Family::llama: return false;
  }
  return false;
}

std::vector<int64_t> hf_param_shape(const ModelConfig& c, const ParamInfo& p) {
  std::vector<int64_t> s(p.shape.begin(), p.shape.end());
  if (has_vocab_rows(p)) s[0] = c.vocab_size;
  if (hf_param_transposed(c, p)) std::swap(s[0], s[1]);
  return s;
}

Tensor hf_param_view(const ModelConfig& c, const ParamLayout& layout, const Tensor& slab,
                     const ParamInfo& p) {
  Tensor t = layout.view(slab, p);
  return has_vocab_rows(p) ? t.slice(0, c.vocab_size) : t;
}

namespace {

std::vector<ShardTensor> stored_tensors(const ModelConfig& c, const ParamLayout& layout,
                                        const Tensor& slab) {
  std::vector<ShardTensor> out;
  for (const ParamInfo& p : layout.params())
  {
    ShardTensor t;
    t.name = hf_param_name(c, p);
    t.tensor = hf_param_view(c, layout, slab, p);
    t.transpose = hf_param_transposed(c, p);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

std::vector<std::string> save_weights(const fs::path& dir, const ModelConfig& config,
                                      const ParamLayout& layout, const Tensor& slab,
                                      const WeightsSaveOptions& options) {
  ShardedWriteOptions w;
  w.max_shard_bytes = options.max_shard_bytes;
  w.staging_pool = options.staging_pool;
  w.metadata["format"] = "pt";  // transformers refuses safetensors files without it
  return write_model_safetensors(dir, stored_tensors(config, layout, slab), w);
}

size_t save_weights_staging_bytes(const ModelConfig& config, const ParamLayout& layout,
                                  DType record) {
  const SafetensorsDType type = safetensors_dtype_of(record);
  size_t most = 0;
  for (const ParamInfo& p : layout.params()) {
    std::vector<int64_t> s = hf_param_shape(config, p);  // stored: transposed back below
    const bool transpose = hf_param_transposed(config, p);
    if (transpose) std::swap(s[0], s[1]);
    const int64_t rows = s.size() == 2 ? s[0] : 1, cols = s.size() == 2 ? s[1] : s[0];
    most = std::max(most, SafetensorsWriter::staging_bytes(type, type, rows, cols, transpose));
  }
  return most;
}

void save_weights_file(const fs::path& file, const ModelConfig& config, const ParamLayout& layout,
                       const Tensor& slab, MemoryPool* staging_pool) {
  SafetensorsWriter w;
  w.set_staging_pool(staging_pool);
  for (const ShardTensor& t : stored_tensors(config, layout, slab))
    w.add(t.name, t.tensor, std::nullopt, t.transpose);
  w.set_metadata("format", "pt");
  w.write(file);
}

WeightsLoad::WeightsLoad(const fs::path& path, const ModelConfig& config,
                         const ParamLayout& layout, DType dtype)
    : config_(config), files_(path) {
  check(config, layout, dtype);
}

WeightsLoad::WeightsLoad(const fs::path& path, const ModelConfig& config,
                         const ParamLayout& layout, const Tensor& slab)
    : config_(config), files_(path) {
  check(config, layout, slab.dtype());
  for (const ParamInfo& p : layout.params()) {
    copies_.push_back({found_.at(p.name), hf_param_view(config, layout, slab, p),
                       hf_param_transposed(config, p)});
    if (has_vocab_rows(p) && config.padded_vocab > config.vocab_size)
      padding_.push_back(layout.view(slab, p).slice(config.vocab_size, config.padded_vocab));
  }
}

void WeightsLoad::check(const ModelConfig& config, const ParamLayout& layout, DType dtype) {
  std::map<std::string, const ParamInfo*> expected;
  for (const ParamInfo& p : layout.params()) expected[p.name] = &p;
  std::map<std::string, const StoredTensor*>& found = found_;
  std::vector<std::string> mismatches, unexpected;
  const StoredTensor* tied_head = nullptr;  // an lm_head.weight the model does not have
  const SafetensorsDType slab_type = safetensors_dtype_of(dtype);
  const bool converts = slab_type == SafetensorsDType::F32 || slab_type == SafetensorsDType::BF16;

  for (const StoredTensor& t : files_.tensors()) {
    const std::string& name = t.entry->name;
    const std::string key = layout_key(config, name);
    if (name == kLmHead && !expected.count(key)) {
      tied_head = &t;
    } else if (is_buffer(config, key)) {
      continue;
    } else if (!expected.count(key)) {
      unexpected.push_back(fmt::format("unexpected '{}' {}{}", name, format_shape(t.entry->shape),
                                       files_.where(t)));
    } else if (!found.emplace(key, &t).second) {
      unexpected.push_back(
          fmt::format("'{}' appears both with and without the '{}' prefix", key, gpt2_prefix()));
    }
  }
  for (const ParamInfo& p : layout.params()) {
    const std::vector<int64_t> want = hf_param_shape(config, p);
    auto it = found.find(p.name);
    if (it == found.end()) {
      mismatches.push_back(
          fmt::format("missing '{}' {}", hf_param_name(config, p), format_shape(want)));
      continue;
    }
    const StoredTensor& t = *it->second;
    const SafetensorsEntry& e = *t.entry;
    if (e.shape != want)
      mismatches.push_back(fmt::format("'{}'{} has shape {}, expected {}", e.name,
                                       files_.where(t), format_shape(e.shape),
                                       format_shape(want)));
    if (!is_float_stored(e.dtype) || (!converts && e.dtype != slab_type))
      mismatches.push_back(fmt::format("'{}'{} is stored as {}, which cannot load into a {} model",
                                       e.name, files_.where(t), safetensors_dtype_name(e.dtype),
                                       dtype_name(dtype)));
  }
  mismatches.insert(mismatches.end(), unexpected.begin(), unexpected.end());
  // The model ties its head to the embedding; an untied checkpoint would load as another model.
  const std::string embedding = layout.params().front().name;
  if (tied_head && found.count(embedding)) {
    const StoredTensor& emb = *found[embedding];
    const SafetensorsEntry &h = *tied_head->entry, &w = *emb.entry;
    if (h.shape != w.shape || h.dtype != w.dtype ||
        std::memcmp(tied_head->file->bytes(h), emb.file->bytes(w), w.nbytes()) != 0)
      mismatches.push_back(fmt::format(
          "'{}' differs from '{}': {} ties the two, so an untied checkpoint cannot be loaded",
          kLmHead, w.name, tied_by(config)));
  }
  if (!mismatches.empty())
    MEMFIT_THROW(IoError, "checkpoint",
                 "{}: the checkpoint does not match the model ({}): {} mismatch{}: {}",
                 files_.source().string(), config.describe(), mismatches.size(),
                 mismatches.size() == 1 ? "" : "es", join_mismatches(mismatches));
}

void WeightsLoad::read(const ParamInfo& p, const Tensor& dst) const {
  const StoredTensor& from = *found_.at(p.name);
  const bool padded = has_vocab_rows(p) && config_.padded_vocab > config_.vocab_size;
  from.file->read(*from.entry, padded ? dst.slice(0, config_.vocab_size) : dst,
                  hf_param_transposed(config_, p));
  from.file->release(*from.entry);
  if (padded) dst.slice(config_.vocab_size, config_.padded_vocab).zero();
}

void WeightsLoad::read_part(const ParamInfo& p, int64_t lo, int64_t hi, float* dst) const {
  const StoredTensor& from = *found_.at(p.name);
  const SafetensorsEntry& e = *from.entry;
  const std::byte* src = from.file->bytes(e);
  const bool transposed = hf_param_transposed(config_, p);
  // memfit's (rows, cols); the file holds (cols, rows) when transposed, and only the real
  // vocabulary's rows of the embedding (padding rows follow them in the layout).
  const int64_t cols = p.shape.rank() == 2 ? p.shape[1] : p.numel;
  const int64_t rows = p.numel / cols;
  const int64_t stored = e.numel();
  auto walk = [&](int64_t a, int64_t b, auto load) {
    for (int64_t i = a; i < b; ++i) {
      if (i >= stored) {
        dst[i - lo] = 0.0f;  // a padding row
        continue;
      }
      dst[i - lo] = load(transposed ? (i % cols) * rows + i / cols : i);
    }
  };
  auto u16 = [&](int64_t k) {
    uint16_t h;
    std::memcpy(&h, src + k * 2, 2);
    return h;
  };
  auto walk_as_stored = [&](int64_t a, int64_t b) {
    switch (e.dtype) {
      case SafetensorsDType::F32:
        walk(a, b, [&](int64_t k) {
          float x;
          std::memcpy(&x, src + k * 4, 4);
          return x;
        });
        break;
      case SafetensorsDType::BF16: walk(a, b, [&](int64_t k) { return f32_from_bf16(u16(k)); }); break;
      case SafetensorsDType::F16: walk(a, b, [&](int64_t k) { return f32_from_f16(u16(k)); }); break;
      default:
        MEMFIT_THROW(IoError, "checkpoint", "'{}' is stored as {}, which cannot load as f32",
                     e.name, safetensors_dtype_name(e.dtype));
    }
  };
  if (transposed) {
    // Read across the whole tensor: its pages leave RAM once the range reaches its end.
    walk_as_stored(lo, hi);
    if (hi >= stored) from.file->release(e);
    return;
  }
  // 1 Mi elements at a time, each piece's pages released once read (a set-up may ask for a
  // whole block's parameter at once: 90 MB of a 7B checkpoint's MLP weight).
  const uint64_t elem = safetensors_dtype_size(e.dtype);
  constexpr int64_t kPiece = int64_t{1} << 20;
  for (int64_t a = lo; a < hi; a += kPiece) {
    const int64_t b = std::min(hi, a + kPiece);
    walk_as_stored(a, b);
    from.file->release_before(e, static_cast<uint64_t>(std::min(b, stored)) * elem);
  }
}

SafetensorsDType WeightsLoad::stored_dtype(const ParamInfo& p) const {
  return found_.at(p.name)->entry->dtype;
}

void WeightsLoad::apply() {
  for (const Copy& c : copies_) {
    c.from->file->read(*c.from->entry, c.to, c.transpose);
    c.from->file->release(*c.from->entry);
  }
  for (Tensor& t : padding_) t.zero();
}

void load_weights(const fs::path& path, const ModelConfig& config, const ParamLayout& layout,
                  Tensor& slab) {
  WeightsLoad(path, config, layout, slab).apply();
}

}  // namespace memfit::io
