// memfit calibrate: measure this CPU's rates for the planner's step-time model (GEMM per
// precision, element-wise kernels, the optimizer's streaming), print them and cache them where
// `memfit plan`, `--ckpt auto` and `--auto-batch` read them (plan/calibration.h).
#include <omp.h>

#include <memory>

#include <fmt/format.h>

#include "memfit/cli/commands.h"
#include "memfit/core/cpu_load.h"
#include "memfit/core/error.h"
#include "memfit/core/scoped_threads.h"
#include "memfit/offload/disk_rate.h"
#include "memfit/plan/calibration.h"

namespace memfit::cli {

namespace {

void print_calibration(const Calibration& c, const std::string& path) {
  fmt::print("memfit calibrate: {}, ISA {}, {} thread{} ({:.1f} s)\n\n", c.cpu, c.isa, c.threads,
             c.threads == 1 ? "" : "s", c.seconds);
  fmt::print("GEMM TFLOP/s   width:");
  for (const GemmRates& g : c.gemm) fmt::print(" {:>7}", g.width);
  fmt::print("\n");
  auto row = [&](const char* name, double GemmRates::*field) {
    fmt::print("  {:<20}", name);
    for (const GemmRates& g : c.gemm) fmt::print(" {:>7.3f}", g.*field / 1e12);
    fmt::print("\n");
  };
  row("f32, block", &GemmRates::f32_block);
  row("f32, LM head", &GemmRates::f32_head);
  row("bf16, block", &GemmRates::bf16_block);
  row("bf16, LM head", &GemmRates::bf16_head);
  fmt::print("  bf16 matmuls {}\n",
             c.bf16_native ? "run natively (oneDNN bf16 GEMM)"
                           : "have no native GEMM here: widened to f32, at the f32 rate");
  fmt::print("flash attention TFLOP/s: f32 {:.3f}, bf16 {:.3f}\n", c.attention_f32 / 1e12,
             c.attention_bf16 / 1e12);
  fmt::print("element-wise kernels: {:.1f} GB/s; optimizer streaming: {:.1f} GB/s; memory copy "
             "(the ranks' shared-memory transport): {:.1f} GB/s\n\n",
             c.elementwise_bytes_per_s / 1e9, c.stream_bytes_per_s / 1e9,
             c.copy_bytes_per_s / 1e9);
  if (c.busy())
    fmt::print("other work kept {:.1f} of {} CPUs busy while this measured: these rates are "
               "partly the neighbours'; the planner measures again once the machine is quiet\n",
               c.other_cpus, cpu::online_cpus());
  fmt::print("saved to {}\n", path);
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Measure this CPU's GEMM, element-wise and streaming rates for the planner's "
                   "step-time estimates, and cache them (a few seconds)");
  auto threads = std::make_shared<int>(0);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--threads", *threads, "OpenMP threads (as the runs to plan; 0: all cores)")
      ->capture_default_str();
  cmd->add_flag("--json", *json, "Print the calibration as one JSON object");
  auto offload_dir = std::make_shared<std::string>();
  cmd->add_option("--offload-dir", *offload_dir,
                  "Also measure the read and write rates of this directory's disk for "
                  "--offload-optimizer (a 64 MiB test, cached per filesystem)");
  cmd->callback([threads, json, offload_dir] {
    if (*threads < 0 || *threads > kMaxThreads)
      MEMFIT_THROW(ConfigError, "config",
                   "--threads must be between 0 (all cores) and {}, got {}", kMaxThreads,
                   *threads);
    if (*threads > 0) omp_set_num_threads(*threads);
    const Calibration c = calibrate();
    const auto path = calibration_cache_path(c.threads);
    save_calibration(path, c);
    const offload::DiskRate* disk =
        offload_dir->empty() ? nullptr : &offload::disk_rate(*offload_dir, /*remeasure=*/true);
    if (*json) {
      nlohmann::json j = c.to_json();
      j["path"] = path.string();
      if (disk)
        j["offload_disk"] = {{"dir", *offload_dir},
                             {"read_bytes_per_s", disk->read_bytes_per_s},
                             {"write_bytes_per_s", disk->write_bytes_per_s},
                             {"path", offload::disk_rate_cache_path(*offload_dir).string()}};
      fmt::print("{}\n", j.dump(2));
    } else {
      print_calibration(c, path.string());
      if (disk)
        fmt::print("offload disk ({}): write {:.2f} GB/s, read {:.2f} GB/s; saved to {}\n",
                   *offload_dir, disk->write_bytes_per_s / 1e9, disk->read_bytes_per_s / 1e9,
                   offload::disk_rate_cache_path(*offload_dir).string());
    }
  });
}

}  // namespace memfit::cli
