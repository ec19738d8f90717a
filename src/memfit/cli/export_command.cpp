// memfit export --hf OUT CHECKPOINT: a checkpoint consolidated into a Hugging Face directory
// (io/checkpoint/checkpoint_export.h), one tensor at a time; --merge-lora folds a LoRA save's
// adapters into its weights (io/checkpoint/lora_merged_source.h).
#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/cli/commands.h"
#include "memfit/core/error.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/checkpoint/checkpoint_export.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/lora_merged_source.h"
#include "memfit/memory/pool.h"

namespace memfit::cli {

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face directory (model.safetensors or shards, "
                "config.json) that transformers' from_pretrained loads, one tensor at a time");
  struct Options {
    std::string hf, checkpoint, max_shard_size = "5GB", dtype;
    bool merge_lora = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--hf", o->hf, "The directory to write (replaced atomically)")->required();
  cmd->add_option("checkpoint", o->checkpoint,
                  "A checkpoint directory (memfit train --save, or Hugging Face's)")
      ->required();
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "Weights above this are sharded, as Hugging Face does (5GB = 5e9 bytes)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "fp32 | bf16 (default: as the checkpoint stores them)");
  cmd->add_flag("--merge-lora", o->merge_lora,
                "A LoRA save (memfit train --lora-rank): write the merged model, each adapted "
                "weight W + (alpha/r) B A, one tensor at a time (without it a LoRA save is "
                "refused)");
  cmd->callback([o] {
    io::ExportOptions options;
    options.max_shard_bytes = io::parse_max_shard_size(o->max_shard_size);
    if (!o->dtype.empty()) {
      if (o->dtype != "fp32" && o->dtype != "bf16")
        MEMFIT_THROW(ConfigError, "config", "--dtype must be fp32 or bf16, got '{}'", o->dtype);
      options.dtype = o->dtype == "fp32" ? DType::f32 : DType::bf16;
    }
    std::error_code ec;
    if (std::filesystem::equivalent(o->hf, o->checkpoint, ec))
      MEMFIT_THROW(ConfigError, "config",
                   "--hf {} is the checkpoint itself: the export writes a new directory (without "
                   "the optimizer state), so name another",
                   o->hf);
    const std::filesystem::path dir = io::locate_checkpoint(o->checkpoint).dir;
    if (!o->merge_lora) io::refuse_lora_checkpoint(dir, "export");
    MemoryPool pool;
    options.pool = &pool;
    std::unique_ptr<io::ParamSource> source = io::open_param_source(o->checkpoint);
    if (o->merge_lora) source = io::make_lora_merged_source(std::move(source), dir, pool);
    const std::vector<std::string> files = io::export_hf(o->hf, *source, options);
    fmt::print("memfit export: {} -> {}: {}\n  model {}; at most {} held at once\n",
               source->describe(), o->hf, fmt::join(files, ", "), source->config().describe(),
               format_mib(pool.bytes_peak()));
  });
}

}  // namespace memfit::cli
