#include "memfit/train/run_agreement.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "memfit/io/data/data_loader.h"
#include "memfit/io/hf/model_hf_config.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// "train_000000.bin (81024 bytes), train_000001.bin (...)": the shards of a split by name and
// size (where they live may differ between hosts).
std::string shards(const std::string& dir, std::string_view split) {
  std::string s;
  for (const fs::path& p : io::find_token_shards(dir, split)) {
    std::error_code ec;
    const auto bytes = fs::file_size(p, ec);
    s += fmt::format("{}{} ({} bytes)", s.empty() ? "" : ", ", p.filename().string(),
                     ec ? 0 : bytes);
  }
  return s.empty() ? "none" : s;
}

// The checkpoint's files by name and size, in name order.
std::string checkpoint_files(const fs::path& dir) {
  if (dir.empty()) return "none (weights from --seed)";
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::error_code ec;
    files.push_back(fmt::format("{} ({} bytes)", e.path().filename().string(),
                                ec ? 0 : e.file_size(ec)));
  }
  std::sort(files.begin(), files.end());
  std::string s;
  for (const std::string& f : files) s += (s.empty() ? "" : ", ") + f;
  return s;
}

}  // namespace

std::vector<dist::AgreedField> run_agreement_fields(const TrainSpec& c) {
  const RunSpec& s = c.run;
  const io::CheckpointLocation& location = c.checkpoint.location;
  auto f = [](auto v) { return fmt::format("{}", v); };
  std::vector<dist::AgreedField> out = {
      {"the model", io::model_config_to_hf_json(s.model).dump()},
      {"--seq-len", f(s.T)},
      {"--batch", f(s.batch)},
      {"--grad-accum", f(s.grad_accum)},
      {"--pp-layers", describe_stages(s.pipeline)},
      {"--pp-schedule", pipe_schedule_label(s)},
      {"--steps", f(s.steps)},
      {"--stop-after", f(c.stop_after)},
      {"--precision", std::string(precision_name(s.precision.precision))},
      {"--master-weights", s.precision.master_weights ? "fp32" : "none"},
      {"--attention", std::string(attention_kind_name(s.attention))},
      {"--ckpt", s.ckpt.name()},
      {"--act-compress", std::string(act_compress_name(s.act_compress))},
      {"--optim", s.optim.name},
      {"--optim-state-dtype", std::string(optim_state_dtype_name(s.optim.state_dtype))},
      {"--beta1", f(s.optim.beta1)},
      {"--beta2", f(s.optim.beta2)},
      {"--eps", f(s.optim.eps)},
      {"--optim-rank", f(s.optim.rank)},
      {"--optim-proj-gap", f(s.optim.proj_gap)},
      {"--weight-decay", f(s.optim.weight_decay)},
      {"--lr", f(c.schedule.lr)},
      {"--lr-schedule", c.schedule.kind},
      {"--min-lr", f(c.schedule.min_lr)},
      {"--warmup", f(c.schedule.warmup)},
      {"--clip", f(s.clip)},
      {"--clip-mode", s.clip_mode == UnitSteps::Clip::unit ? "unit" : "global"},
      {"--update-in-backward", f(s.update_in_backward)},
      {"--seed", f(c.seed)},
      {"--shuffle", f(s.shuffle)},
      {"--repeat-batch", f(c.repeat_batch)},
      {"--bucket-mb", f(c.bucket_mb)},
      {"--zero", f(s.zero)},
      // Whether the state is offloaded, not where: each rank's --offload-dir (and --disk-limit)
      // is its own disk's (Note [NVMe offload], "Under ZeRO").
      {"--offload-optimizer", s.offload.optimizer ? "nvme" : "none"},
      {"--offload-grads", s.offload.grads ? "nvme" : "none"},
      {"--prefetch-depth", f(s.prefetch_depth)},
      {"--persist-threshold", f(s.persist_threshold)},
      {"--sync-every-micro-batch", f(s.sync_every_micro_batch)},
      {"--grad-dtype", s.grad_dtype == DType::bf16 ? "bf16" : "fp32"},
      {"--eval-every", f(c.eval_every)},
      {"--eval-batches", f(c.eval_batches)},
      {"--initial-loss-scale", f(c.loss_scaler.initial_scale)},
      {"--loss-scale-window", f(c.loss_scaler.window)},
      {"--hysteresis", f(c.loss_scaler.hysteresis)},
      {"--min-loss-scale", f(c.loss_scaler.min_scale)},
      {"the training data", shards(s.data_dir, "train")},
      {"the validation data", shards(s.data_dir, "val")},
      {"the starting checkpoint",
       location.dir.empty() ? checkpoint_files(location.dir)
                            : fmt::format("{} {}", c.checkpoint.option,
                                          checkpoint_files(location.dir))},
  };
  return out;
}

}  // namespace memfit
