// LoRA's adapter files in a run (train/train_run.h): PEFT's adapter_model.safetensors and
// memfit's adapter_optimizer.safetensors hold whole tensors at every layout. Under --tp a rank
// holds slices of them, under --pp a stage its blocks' (Note [LoRA], "Under --tp" and "Under
// --pp", docs/notes/lora.md): a load reads the whole files and keeps its part
// (LoraLayout::whole_runs); a save gathers the tensor and pipeline groups' parts into the whole
// adapters and their element-wise optimizer state, which rank 0 writes as one process does, so
// a save loads at any layout.
#include <algorithm>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/model/layout_map.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// The state tensors of `opt` (over a rank's adapters) and `whole` (over the whole adapters),
// paired by name: element-wise f32 state alone, one element per layout element (AdamW's f32
// moments, SGD's and Lion's momentum; RunSpec refuses the others under --tp with a save).
std::vector<std::pair<Tensor, Tensor>> paired_state(const Optimizer& opt, const Optimizer& whole,
                                                    int64_t n, int64_t whole_n) {
  std::vector<std::pair<Tensor, Tensor>> out;
  const auto mine = opt.state(), all = whole.state();
  MEMFIT_CHECK(mine.size() == all.size(), "lora", "{} state tensors against the whole's {}",
               mine.size(), all.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const Tensor &a = mine[i].second, &b = all[i].second;
    MEMFIT_CHECK(mine[i].first == all[i].first && a.dtype() == DType::f32 &&
                     b.dtype() == DType::f32 && a.numel() == n && b.numel() == whole_n,
                 "lora",
                 "the adapters' optimizer state '{}' ({} {}) is not one f32 element per adapter "
                 "element: its slices cannot be gathered whole",
                 mine[i].first, dtype_name(a.dtype()), a.numel());
    out.emplace_back(a, b);
  }
  return out;
}

}  // namespace

void TrainRun::load_adapters(const fs::path& dir) { load_adapters(dir, *gpt_); }

void TrainRun::load_adapters(const fs::path& dir, Transformer& gpt) {
  const LoraLayout& lora = *gpt.lora();
  if (!layout_split(mc_)) {
    io::load_lora_adapter(dir, mc_, lora, gpt.lora_weights());
    return;
  }
  // The whole adapters in a pool of their own (set-up, not the step's memory), sliced.
  const LoraLayout whole = lora.whole();
  MemoryPool heap;
  const Tensor all =
      Tensor::empty(heap, {whole.total()}, DType::f32, Category::staging, "lora.whole");
  io::load_lora_adapter(dir, whole_run_model(gpt.config()), whole, all);
  float* d = gpt.lora_weights().data<float>();
  for (const SliceRun& r : lora.whole_runs(grid_.tensor().rank()))
    std::copy_n(all.data<float>() + r.whole, r.n, d + r.local);
}

void TrainRun::load_adapter_state(const fs::path& dir) { load_adapter_state(dir, *gpt_, *opt_); }

void TrainRun::load_adapter_state(const fs::path& dir, Transformer& gpt, Optimizer& opt) {
  const fs::path file = dir / io::kAdapterOptimizerFile;
  if (!layout_split(mc_)) {
    io::load_optimizer_state(file, opt);
    return;
  }
  const LoraLayout& lora = *gpt.lora();
  const LoraLayout whole = lora.whole();
  MemoryPool heap;
  const std::unique_ptr<Optimizer> w = make_optimizer(spec_.optim, whole.param_layout(), &heap);
  io::load_optimizer_state(file, *w);
  const std::vector<SliceRun> runs = lora.whole_runs(grid_.tensor().rank());
  for (const auto& [mine, all] : paired_state(opt, *w, lora.total(), whole.total()))
    for (const SliceRun& r : runs)
      std::copy_n(all.data<float>() + r.whole, r.n, mine.data<float>() + r.local);
  opt.set_steps_taken(w->steps_taken());
}

// Every rank (a collective over its tensor group, then its pipeline group): each tensor
// rank's slab gathered and placed by its runs (the replicated matrices written by every rank
// alike, the same values), then under --pp each stage's part of the whole slab taken from that
// stage's. Under --pp-schedule interleaved a rank places each of its chunks' parts (virtual
// stage c x P + stage) before the pipeline group's gather, and virtual stage v's part is taken
// from rank v mod P's.
void TrainRun::gather_adapters() {
  if (!layout_split(mc_)) return;
  if (!whole_lora_) {
    whole_lora_.emplace(gpt_->lora()->whole());
    adapter_heap_ = std::make_unique<MemoryPool>();
    whole_adapters_ = Tensor::empty(*adapter_heap_, {whole_lora_->total()}, DType::f32,
                                    Category::staging, "lora.whole");
    whole_adapter_opt_ = make_optimizer(spec_.optim, whole_lora_->param_layout(),
                                        adapter_heap_.get());
  }
  const int T = mc_.tp, P = spec_.pp(), V = spec_.pipe_virtual;
  const int S = P > 1 ? static_cast<int>(spec_.pipeline.size()) : 1;  // virtual stages
  const int64_t w = whole_lora_->total();
  // Every virtual stage's tensor ranks' runs (a rank's own chunks', and the others' for --pp's
  // pick).
  std::vector<std::vector<std::vector<SliceRun>>> runs(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    ModelConfig c = mc_;
    if (P > 1) c.set_pipeline_stage(spec_.pipeline[static_cast<size_t>(s)]);
    const LoraLayout stage(c, spec_.lora);
    for (int t = 0; t < T; ++t) runs[static_cast<size_t>(s)].push_back(stage.whole_runs(t));
  }
  // This rank's models: chunk c is virtual stage c x P + stage (one chunk without interleaving).
  struct Part {
    Transformer* gpt;
    Optimizer* opt;
    size_t stage;
  };
  std::vector<Part> parts;
  const int me = P > 1 ? pipe_.rank() : 0;
  for (int c = 0; c < V; ++c)
    parts.push_back({&chunk_model(c), c == 0 ? opt_.get() : chunks_[size_t(c - 1)]->opt.get(),
                     static_cast<size_t>(c * P + me)});
  std::vector<float> stages(P > 1 ? size_t(P * w) : 0);
  // `mine[i]`: parts[i]'s tensor; `to`: the whole one.
  auto gather = [&](const std::vector<Tensor>& mine, const Tensor& whole) {
    float* to = whole.data<float>();
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t n = mine[i].numel();
      std::vector<float> all(static_cast<size_t>(T * n));
      if (T > 1)
        parts[i].gpt->tensor_group()->all_gather({mine[i].data<float>(), static_cast<size_t>(n)},
                                                 all);
      else
        std::copy_n(mine[i].data<float>(), n, all.data());
      for (int t = 0; t < T; ++t)
        for (const SliceRun& r : runs[parts[i].stage][static_cast<size_t>(t)])
          std::copy_n(all.data() + t * n + r.local, r.n, to + r.whole);
    }
    if (P == 1) return;
    pipe_.all_gather(to, stages.data(), std::vector<int64_t>(size_t(P), w), sizeof(float));
    for (int s = 0; s < S; ++s)
      for (const std::vector<SliceRun>& rank_runs : runs[static_cast<size_t>(s)])
        for (const SliceRun& r : rank_runs)
          std::copy_n(stages.data() + (s % P) * w + r.whole, r.n, to + r.whole);
  };
  std::vector<Tensor> weights;
  std::vector<std::vector<std::pair<Tensor, Tensor>>> state;
  for (const Part& p : parts) {
    weights.push_back(p.gpt->lora_weights());
    state.push_back(paired_state(*p.opt, *whole_adapter_opt_, p.gpt->lora()->total(), w));
  }
  gather(weights, whole_adapters_);
  for (size_t k = 0; k < state.front().size(); ++k) {
    std::vector<Tensor> mine;
    for (const auto& pairs : state) mine.push_back(pairs[k].first);
    gather(mine, state.front()[k].second);
  }
  whole_adapter_opt_->set_steps_taken(opt_->steps_taken());
}

// Rank 0, into the save's temporary directory: the adapters and their optimizer's state, whole
// (gathered by gather_adapters under --tp).
void TrainRun::save_adapters(const fs::path& dir) {
  if (!layout_split(mc_)) {
    io::save_lora_adapter(dir, mc_, *gpt_->lora(), gpt_->lora_weights());
    io::save_optimizer_state(dir / io::kAdapterOptimizerFile, *opt_);
    return;
  }
  MEMFIT_CHECK(whole_lora_.has_value(), "lora", "the adapters were not gathered for the save");
  io::save_lora_adapter(dir, whole_run_model(mc_), *whole_lora_, whole_adapters_);
  io::save_optimizer_state(dir / io::kAdapterOptimizerFile, *whole_adapter_opt_);
}

}  // namespace memfit
