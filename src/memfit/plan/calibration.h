// The rates the planner's step-time model (plan/step_time.h) divides by, measured on the CPU at
// hand instead of constants from one machine: oneDNN GEMM rates at the shapes of a GPT-2 block's
// and LM head's matmuls (f32, and bf16 through the route bf16 matmuls take here), flash
// attention's rate, the effective rate of memfit's element-wise kernels, and the streaming rate
// of the optimizer update and of a memory copy (the collectives' transport between ranks on
// one machine). A few
// seconds; cached as JSON per CPU model, ISA cap and thread count under the user's cache
// directory, so `memfit plan`, `--ckpt auto` and `--auto-batch` measure once per machine and
// `memfit calibrate` measures again. See docs/notes/planner.md, Note [Step-time model].
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/core/cache_dir.h"

namespace memfit {

// GEMM rates (FLOP/s) at one model width C: `block` over a block's four linear layers (qkv,
// attention projection, fc, fc projection) with 2048 rows (8 x 256 tokens; 512 at width 1536),
// each forward with its bias, d(input) and d(weight) accumulated as the model runs them;
// `head` over the LM head's three matmuls at the engine's default rows (the default chunk; on
// oneDNN's bf16 GEMM d(norm) at lm_head_dx_rows and d(head) at lm_head_grad_rows) and 32768
// vocabulary rows.
struct GemmRates {
  int width = 0;
  double f32_block = 0, f32_head = 0, bf16_block = 0, bf16_head = 0;
};

struct Calibration {
  // 6: f32 GEMMs in oneDNN's gemm:jit (Note [GEMM kernel]), whose rates a version-5 file, taken
  // in brgemm, understates: such a file is measured again. 7: bf16 weight gradients in gemm:jit
  // where oneDNN's bf16 kernel is not AMX, likewise.
  // 8: bf16 widened on plain AVX-512 (dnnl_gemm::bf16_native), where a version-7 file holds the
  // rate of oneDNN's emulated bf16 GEMM.
  static constexpr int kVersion = 8;
  std::string cpu;     // cpu::identity()
  std::string isa;     // cpu::isa_name(cpu::max_isa()): the cap it ran under
  int threads = 0;     // OpenMP threads it ran with
  bool bf16_native = false;  // bf16 GEMMs ran in bf16; else widened, at the f32 rate
  std::vector<GemmRates> gemm;     // by increasing width
  // Flash attention forward and backward (8 x 256 tokens, 12 heads of 64), in the FLOPs
  // step_flops counts for it (4 x the causal scores' 2 B T^2 C); bf16 at the f32 rate where
  // the kernel has no bf16 path.
  double attention_f32 = 0, attention_bf16 = 0;
  double elementwise_bytes_per_s = 0;  // LayerNorm, residual, GELU forward and backward
  double stream_bytes_per_s = 0;       // the AdamW update over buffers past the caches
  // memcpy of 64 MiB (bytes copied per second), past any cache: the shared-memory transport's
  // rate, at which the step-time model prices the ZeRO stages' collectives (a first-order
  // estimate: Note [Fit a budget]).
  double copy_bytes_per_s = 0;
  double seconds = 0;                  // how long the measurement took
  std::string measured_at;             // UTC, ISO 8601
  // CPUs other work kept busy while it measured, on average (cpu_load.h); 0 in files written
  // before it was recorded.
  double other_cpus = 0;

  // Whether other work disturbed the measurement (cpu::load_disturbs): its rates are then
  // partly the neighbours', and a cached copy is measured again once the machine is quiet.
  bool busy() const;

  // GEMM rate for a layer of width C (interpolated in log2 C between measured widths, the end
  // rates outside them).
  double block_rate(bool bf16, int width) const;
  double head_rate(bool bf16, int width) const;

  nlohmann::json to_json() const;
  // Throws IoError naming `source` and the field when the JSON is not a calibration of this
  // version.
  static Calibration from_json(const nlohmann::json& j, const std::string& source);
};

// Runs the measurements with the current OpenMP thread count and ISA cap.
Calibration calibrate();

// Where calibrations are cached: calibration_cache_dir() (core/cache_dir.h).
// The cache file for this CPU (cpu::identity()), the current ISA cap and `threads`:
// calibration-<cpu>-<isa>-<threads>t.json.
std::filesystem::path calibration_cache_path(int threads);

// Reads a cached calibration; IoError (naming the file and what is wrong) if it is missing,
// not JSON, or not a calibration for this CPU, cap and thread count.
Calibration load_calibration(const std::filesystem::path& path, int threads);
// Writes it atomically, creating the folder.
void save_calibration(const std::filesystem::path& path, const Calibration& c);

// Whether a cached calibration should be measured again rather than used, given the CPUs other
// work keeps busy now and the file's age: it was taken on a busy machine, the machine is quiet
// now, and it is kBusyCalibrationKeptSeconds old or more. (Without the wait, a machine busy in
// bursts, such as a test suite's jobs, measured again at every quiet moment, and each
// measurement, taken beside the next job, was busy again.)
inline constexpr double kBusyCalibrationKeptSeconds = 600;
bool calibration_remeasure(const Calibration& cached, double other_cpus_now, double age_seconds);

// `measure()`'s calibration saved at `path`, unless another process of the machine saves one
// there first: one process measures at a time (an exclusive flock on `<path>.lock`), and one
// that waited while another measured takes that file instead of measuring beside it. (The ranks
// of an mpirun job each plan their step time: every one of four ranks on two cores measured at
// once, each timing its GEMMs against the others', so every result was busy and measured again
// by the next job: minutes a test instead of seconds, session 36.)
Calibration measure_once(const std::filesystem::path& path, int threads,
                         const std::function<Calibration()>& measure);

// The calibration for the current OpenMP thread count: remembered in the process, else read
// from the cache, else measured and saved (saying so in one line on `note`, also when a cache
// file was unreadable and is replaced, or was measured on a busy machine and this one is quiet
// now: 100 ms of looking, only for such a file).
const Calibration& machine_calibration(std::FILE* note = stderr);

}  // namespace memfit
