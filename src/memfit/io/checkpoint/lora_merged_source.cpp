#include "memfit/io/checkpoint/lora_merged_source.h"

#include <algorithm>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/model/lora_merge.h"

namespace memfit::io {

namespace fs = std::filesystem;

namespace {

class LoraMergedSource final : public ParamSource {
 public:
  LoraMergedSource(std::unique_ptr<ParamSource> base, const fs::path& dir, MemoryPool& pool)
      : base_(std::move(base)),
        lora_(base_->config(), read_lora_options(dir, base_->config())),
        adapters_(Tensor::empty(pool, {lora_.total()}, DType::f32, Category::staging,
                                "export.lora")),
        dir_(dir),
        pool_(pool) {
    load_lora_adapter(dir, base_->config(), lora_, adapters_);
  }

  const ModelConfig& config() const override { return base_->config(); }
  const ParamLayout& layout() const override { return base_->layout(); }
  DType dtype() const override { return base_->dtype(); }
  void read(const ParamInfo& p, const Tensor& dst) override {
    base_->read(p, dst);
    lora_merge_param(config(), lora_, adapters_, p, dst);
  }
  std::string describe() const override {
    const LoraOptions& o = lora_.options();
    return fmt::format("{} + LoRA {} (rank {}, alpha {}, {} adapters merged)", base_->describe(),
                       dir_.string(), o.rank, o.alpha, lora_.params().size());
  }

 protected:
  // The whole parameter, merged, then the part asked for (merging needs whole rows of B A).
  void read_part(const ParamInfo& p, int64_t lo, int64_t hi, float* dst) override {
    Tensor whole = Tensor::empty(pool_, p.shape, DType::f32, Category::staging, "export.param");
    base_->read_range({p.offset, p.offset + p.numel}, whole.data<float>());
    lora_merge_param(config(), lora_, adapters_, p, whole);
    std::copy(whole.data<float>() + lo, whole.data<float>() + hi, dst);
  }

 private:
  std::unique_ptr<ParamSource> base_;
  LoraLayout lora_;
  Tensor adapters_;
  fs::path dir_;
  MemoryPool& pool_;
};

}  // namespace

std::unique_ptr<ParamSource> make_lora_merged_source(std::unique_ptr<ParamSource> base,
                                                     const fs::path& adapter_dir,
                                                     MemoryPool& pool) {
  if (!has_lora_adapter(adapter_dir))
    MEMFIT_THROW(IoError, "export", "--merge-lora: {} holds no LoRA adapters (no {})",
                 adapter_dir.string(), kAdapterConfigFile);
  return std::make_unique<LoraMergedSource>(std::move(base), adapter_dir, pool);
}

}  // namespace memfit::io
