// Measuring the planner's rates and caching them; see calibration.h.
#include "memfit/plan/calibration.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "memfit/core/cpu.h"
#include "memfit/core/cpu_load.h"
#include "memfit/core/error.h"
#include "memfit/memory/tensor.h"
#include "memfit/io/atomic_file.h"
#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/flash_attention.h"
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/memory/pool.h"
#include "memfit/model/activation_plan.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

constexpr int kWidths[] = {384, 768, 1536};
constexpr int64_t kBlockRows = 2048;  // 8 x 256 tokens
// A slice of the vocabulary: the rate, not the whole head; large enough that the head's f32
// weight gradient (96 MiB at width 768) is past the caches, as GPT-2's 154 MB is: its
// accumulation is bound by that traffic (Note [Fused LM head], "The gradient's group").
constexpr int64_t kHeadVocab = 32768;
constexpr int kReps = 1;              // timed runs after one warm-up; their mean counts

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The mean of kReps runs of `run` after a warm-up run. The mean, not the fastest: a step's
// median on a machine with other work includes its share of interruptions, and so should the
// rates it is estimated from (on a quiet machine the two agree).
double mean_seconds(const std::function<void()>& run) {
  run();
  double total = 0;
  for (int i = 0; i < kReps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    total += seconds_since(t0);
  }
  return total / kReps;
}

// One GEMM shape: C (M, N) = op(A) @ op(B), B stored as the layer stores it; `accumulate`
// (beta 1) for a weight gradient, `bias` for a forward.
struct Shape3 {
  int64_t M, N, K;
  bool trans_a, trans_b;
  bool accumulate = false, bias = false;
};

// FLOP/s over `shapes`, all in `dt` operands with f32 output. Throws what dnnl_gemm throws
// (a bf16 primitive this CPU or cap cannot create).
double gemm_rate(MemoryPool& pool, const std::vector<Shape3>& shapes, DType dt) {
  double flops = 0, seconds = 0;
  for (const Shape3& s : shapes) {
    Tensor a = Tensor::empty(pool, {s.M * s.K}, dt, Category::workspace, "calibrate.a");
    Tensor b = Tensor::empty(pool, {s.K * s.N}, dt, Category::workspace, "calibrate.b");
    Tensor c = Tensor::empty(pool, {s.M * s.N}, DType::f32, Category::workspace, "calibrate.c");
    Tensor bias = Tensor::empty(pool, {s.N}, DType::f32, Category::workspace, "calibrate.bias");
    for (Tensor* t : {&a, &b, &c, &bias})  // zeros: no denormals, pages touched
      std::memset(t->raw_data(), 0, t->nbytes());
    kernels::dnnl_gemm::GemmSpec g;
    g.M = s.M;
    g.N = s.N;
    g.K = s.K;
    g.trans_a = s.trans_a;
    g.trans_b = s.trans_b;
    g.lda = s.trans_a ? s.M : s.K;
    g.ldb = s.trans_b ? s.K : s.N;
    g.ldc = s.N;
    g.a_type = g.b_type = dt;
    g.beta = s.accumulate ? 1.0f : 0.0f;
    g.bias = s.bias;
    seconds += mean_seconds([&] {
      kernels::dnnl_gemm::execute(g, a.raw_data(), b.raw_data(), c.raw_data(),
                                  s.bias ? bias.raw_data() : nullptr);
    });
    flops += 2.0 * s.M * s.N * s.K;
  }
  return flops / seconds;
}

// A block's four linear layers (qkv C -> 3C, attention projection C -> C, fc C -> 4C, its
// projection 4C -> C), each forward (x W^T + b), d(input) = dout W and d(weight) += dout^T x.
std::vector<Shape3> block_shapes(int64_t C) {
  // Past width 768, rows fall as 1/C^2 (512 at 1536), so each width costs the same: calibration
  // stays a few seconds.
  const int64_t W = std::max<int64_t>(768, C);
  const int64_t R = kBlockRows * 768 * 768 / (W * W);
  std::vector<Shape3> shapes;
  for (auto [in, out] : {std::pair{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}) {
    shapes.push_back({R, out, in, false, true, false, true});
    shapes.push_back({R, in, out, false, false});
    shapes.push_back({out, in, R, true, false, true});
  }
  return shapes;
}

// The LM head's three matmuls at the engine's default rows (model/activation_plan.h): the
// logits of the default chunk; d(norm) and d(head) a chunk at a time, or, `grouped` (oneDNN's
// bf16 GEMM), lm_head_dx_rows and lm_head_grad_rows at a time. The rates of a larger
// --lm-head-group are not measured: the estimate prices its head at the default group's rate.
std::vector<Shape3> head_shapes(int64_t C, bool grouped) {
  ActivationOptions o;  // the default chunk and group
  o.precision = grouped ? Precision::bf16 : Precision::fp32;
  const int64_t many = int64_t{1} << 20;  // rows enough that no rule is cut to the step's
  const int64_t R = lm_head_rows(o, many), V = kHeadVocab;
  const int64_t dx = lm_head_dx_rows(o, many), dw = lm_head_grad_rows(o, many);
  return {{R, V, C, false, true}, {dx, C, V, false, false}, {V, C, dw, true, false, true}};
}

// FLOP/s of flash attention forward and backward at 8 x 256 tokens, 12 heads of 64, counted as
// step_flops counts them: 4 x 2 B T^2 C. Throws what the kernel throws for a dtype it lacks.
double attention_rate(MemoryPool& pool, DType dt) {
  const int64_t B = 8, T = 256, NH = 12, C = 64 * NH;
  auto t = [&](Shape shape, DType type) {
    Tensor x = Tensor::empty(pool, shape, type, Category::workspace, "calibrate.attn");
    std::memset(x.raw_data(), 0, x.nbytes());
    return x;
  };
  Tensor qkv = t({B, T, 3 * C}, dt), out = t({B, T, C}, dt), dout = t({B, T, C}, dt);
  Tensor dqkv = t({B, T, 3 * C}, dt), lse = t({B, NH, T}, DType::f32);
  const size_t fw = kernels::flash_attention_forward_workspace_bytes(B, T, C, NH, dt);
  const size_t bw = kernels::flash_attention_backward_workspace_bytes(B, T, C, NH, dt);
  Tensor ws = t({static_cast<int64_t>((std::max(fw, bw) + 3) / 4)}, DType::f32);
  const double seconds = mean_seconds([&] {
    kernels::flash_attention_forward(out, lse, qkv, ws, NH);
    kernels::flash_attention_backward(dqkv, dout, qkv, out, lse, ws, NH);
  });
  return 4.0 * 2.0 * B * T * T * C / seconds;
}

// Bytes per second of the element-wise kernels a block runs, on one block's tensors at width
// 768 and 2048 rows (the traffic each moves, in f32 elements per row: LayerNorm forward 2C,
// residual 3C, GELU forward 8C and backward 12C, LayerNorm backward 4C: 29C).
double elementwise_rate(MemoryPool& pool) {
  const int64_t R = kBlockRows, C = 768;
  auto t = [&](Shape shape, float fill) {
    Tensor x = Tensor::empty(pool, shape, DType::f32, Category::workspace, "calibrate.x");
    std::fill_n(x.data<float>(), x.numel(), fill);
    return x;
  };
  Tensor x = t({R, C}, 0.5f), y = t({R, C}, 0.f), r = t({R, C}, 0.f), dx = t({R, C}, 0.f);
  Tensor w = t({C}, 1.f), b = t({C}, 0.f), dw = t({C}, 0.f), db = t({C}, 0.f);
  Tensor mean = t({R}, 0.f), rstd = t({R}, 1.f);
  Tensor h = t({R, 4 * C}, 0.25f), g = t({R, 4 * C}, 0.f), dg = t({R, 4 * C}, 0.f);
  const double seconds = mean_seconds([&] {
    kernels::layernorm_forward(y, mean, rstd, x, w, b);
    kernels::residual_forward(r, x, y);
    kernels::gelu_forward(g, h);
    kernels::gelu_backward(dg, h, g);
    kernels::layernorm_backward(dx, dw, db, y, x, w, mean, rstd);
  });
  return 29.0 * C * R * 4 / seconds;
}

// Bytes per second of AdamW over 8M parameters (7 f32 accesses each), past any cache.
double stream_rate(MemoryPool& pool) {
  const int64_t n = int64_t(8) << 20;
  auto t = [&](float fill) {
    Tensor x = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "calibrate.p");
    std::fill_n(x.data<float>(), n, fill);
    return x;
  };
  Tensor p = t(0.1f), grad = t(0.01f), m = t(0.f), v = t(0.f);
  kernels::AdamWHyper h;
  int64_t step = 0;
  const double seconds = mean_seconds([&] { kernels::adamw_update(p, grad, m, v, h, ++step); });
  return 28.0 * n / seconds;
}

// Bytes per second memcpy copies between two 64 MiB buffers, past any cache: what OpenMPI's
// shared-memory transport does with every byte a collective moves between ranks on one machine
// (copied into a shared segment by its sender and out by its receiver). One thread: a rank's
// collectives copy on the thread that calls MPI.
double copy_rate(MemoryPool& pool) {
  const int64_t n = int64_t(64) << 20;
  Tensor a = Tensor::empty(pool, {n}, DType::u8, Category::workspace, "calibrate.copy_from");
  Tensor b = Tensor::empty(pool, {n}, DType::u8, Category::workspace, "calibrate.copy_to");
  std::memset(a.data<uint8_t>(), 1, n);
  std::memset(b.data<uint8_t>(), 0, n);
  const double seconds =
      mean_seconds([&] { std::memcpy(b.data<uint8_t>(), a.data<uint8_t>(), n); });
  return double(n) / seconds;
}

// log2-linear interpolation of rate(width) over the measured widths.
double interpolate(const std::vector<GemmRates>& g, int width,
                   double (*rate)(const GemmRates&)) {
  MEMFIT_CHECK(!g.empty(), "calibration", "no GEMM rates");
  if (width <= g.front().width) return rate(g.front());
  if (width >= g.back().width) return rate(g.back());
  size_t i = 1;
  while (g[i].width < width) ++i;
  const double f = (std::log2(width) - std::log2(g[i - 1].width)) /
                   (std::log2(g[i].width) - std::log2(g[i - 1].width));
  return rate(g[i - 1]) + f * (rate(g[i]) - rate(g[i - 1]));
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// "AMD EPYC 9R14" -> "amd-epyc-9r14": safe in a file name.
std::string slug(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.empty() && out.back() != '-')
      out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "unknown-cpu" : out;
}

}  // namespace

bool Calibration::busy() const { return cpu::load_disturbs(other_cpus, threads); }

double Calibration::block_rate(bool bf16, int width) const {
  return bf16 ? interpolate(gemm, width, [](const GemmRates& r) { return r.bf16_block; })
              : interpolate(gemm, width, [](const GemmRates& r) { return r.f32_block; });
}

double Calibration::head_rate(bool bf16, int width) const {
  return bf16 ? interpolate(gemm, width, [](const GemmRates& r) { return r.bf16_head; })
              : interpolate(gemm, width, [](const GemmRates& r) { return r.f32_head; });
}

nlohmann::json Calibration::to_json() const {
  nlohmann::json j;
  j["version"] = kVersion;
  j["cpu"] = cpu;
  j["isa"] = isa;
  j["threads"] = threads;
  j["bf16_native"] = bf16_native;
  j["gemm_flops_per_s"] = nlohmann::json::array();
  for (const GemmRates& g : gemm)
    j["gemm_flops_per_s"].push_back({{"width", g.width},
                                     {"f32_block", g.f32_block},
                                     {"f32_head", g.f32_head},
                                     {"bf16_block", g.bf16_block},
                                     {"bf16_head", g.bf16_head}});
  j["attention_flops_per_s"] = {{"f32", attention_f32}, {"bf16", attention_bf16}};
  j["elementwise_bytes_per_s"] = elementwise_bytes_per_s;
  j["stream_bytes_per_s"] = stream_bytes_per_s;
  j["copy_bytes_per_s"] = copy_bytes_per_s;
  j["seconds"] = seconds;
  j["measured_at"] = measured_at;
  j["other_cpus"] = other_cpus;
  return j;
}

Calibration Calibration::from_json(const nlohmann::json& j, const std::string& source) {
  Calibration c;
  try {
    if (j.at("version").get<int>() != kVersion)
      MEMFIT_THROW(IoError, "calibration",
                   "{}: written by another version of memfit (format {}; this one reads {})",
                   source, j.at("version").dump(), kVersion);
    c.cpu = j.at("cpu").get<std::string>();
    c.isa = j.at("isa").get<std::string>();
    c.threads = j.at("threads").get<int>();
    c.bf16_native = j.at("bf16_native").get<bool>();
    for (const auto& g : j.at("gemm_flops_per_s"))
      c.gemm.push_back({g.at("width").get<int>(), g.at("f32_block").get<double>(),
                        g.at("f32_head").get<double>(), g.at("bf16_block").get<double>(),
                        g.at("bf16_head").get<double>()});
    c.attention_f32 = j.at("attention_flops_per_s").at("f32").get<double>();
    c.attention_bf16 = j.at("attention_flops_per_s").at("bf16").get<double>();
    c.elementwise_bytes_per_s = j.at("elementwise_bytes_per_s").get<double>();
    c.stream_bytes_per_s = j.at("stream_bytes_per_s").get<double>();
    c.copy_bytes_per_s = j.at("copy_bytes_per_s").get<double>();
    c.seconds = j.value("seconds", 0.0);
    c.measured_at = j.value("measured_at", std::string());
    c.other_cpus = j.value("other_cpus", 0.0);
  } catch (const nlohmann::json::exception& e) {
    MEMFIT_THROW(IoError, "calibration", "{}: not a calibration: {}", source, e.what());
  }
  bool positive = c.elementwise_bytes_per_s > 0 && c.stream_bytes_per_s > 0 &&
                  c.copy_bytes_per_s > 0 && !c.gemm.empty() &&
                  c.attention_f32 > 0 && c.attention_bf16 > 0;
  for (const GemmRates& g : c.gemm)
    positive = positive && g.width > 0 && g.f32_block > 0 && g.f32_head > 0 &&
               g.bf16_block > 0 && g.bf16_head > 0;
  if (!positive)
    MEMFIT_THROW(IoError, "calibration", "{}: a rate is missing or not positive", source);
  return c;
}

Calibration calibrate() {
  const auto t0 = std::chrono::steady_clock::now();
  const cpu::OtherLoad load;
  Calibration c;
  c.cpu = cpu::identity();
  c.isa = std::string(cpu::isa_name(cpu::max_isa()));
  c.threads = omp_get_max_threads();
  MemoryPool pool;
  // bf16 through the route the model's bf16 matmuls take: oneDNN's bf16 GEMM where it is native
  // (AVX512_BF16, AMX); else the operands are widened and the f32 GEMM runs (matmul_widened.h),
  // whose rate stands for bf16's (the widening passes are counted as element-wise work).
  c.bf16_native = !kernels::matmul_widens(DType::bf16);
  for (int width : kWidths) {
    GemmRates g;
    g.width = width;
    g.f32_block = gemm_rate(pool, block_shapes(width), DType::f32);
    g.f32_head = gemm_rate(pool, head_shapes(width, false), DType::f32);
    g.bf16_block = c.bf16_native ? gemm_rate(pool, block_shapes(width), DType::bf16) : g.f32_block;
    g.bf16_head =
        c.bf16_native ? gemm_rate(pool, head_shapes(width, true), DType::bf16) : g.f32_head;
    c.gemm.push_back(g);
  }
  c.attention_f32 = attention_rate(pool, DType::f32);
  try {
    c.attention_bf16 = attention_rate(pool, DType::bf16);
  } catch (const Error&) {
    c.attention_bf16 = c.attention_f32;
  }
  c.elementwise_bytes_per_s = elementwise_rate(pool);
  c.stream_bytes_per_s = stream_rate(pool);
  c.copy_bytes_per_s = copy_rate(pool);
  c.seconds = seconds_since(t0);
  c.other_cpus = load.cpus();
  c.measured_at = utc_now();
  return c;
}

fs::path calibration_cache_path(int threads) {
  return calibration_cache_dir() / fmt::format("calibration-{}-{}-{}t.json",
                                               slug(cpu::identity()),
                                               cpu::isa_name(cpu::max_isa()), threads);
}

Calibration load_calibration(const fs::path& path, int threads) {
  const std::string text = io::read_file_to_string(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MEMFIT_THROW(IoError, "calibration", "{}: not valid JSON: {}", path.string(), e.what());
  }
  Calibration c = Calibration::from_json(j, path.string());
  const std::string isa(cpu::isa_name(cpu::max_isa()));
  if (c.cpu != cpu::identity() || c.isa != isa || c.threads != threads)
    MEMFIT_THROW(IoError, "calibration",
                 "{}: measured on '{}' ({}, {} threads), this run is '{}' ({}, {} threads)",
                 path.string(), c.cpu, c.isa, c.threads, cpu::identity(), isa, threads);
  return c;
}

void save_calibration(const fs::path& path, const Calibration& c) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec)
    MEMFIT_THROW(IoError, "calibration", "cannot create {}: {}", path.parent_path().string(),
                 ec.message());
  io::write_file_atomic(path, c.to_json().dump(2) + "\n");
}

bool calibration_remeasure(const Calibration& cached, double other_cpus_now,
                           double age_seconds) {
  return cached.busy() && !cpu::load_disturbs(other_cpus_now, cached.threads) &&
         age_seconds >= kBusyCalibrationKeptSeconds;
}

namespace {

// An exclusive flock(2) on `path` (created if missing), held for the object's life; none where
// the file cannot be opened (the save then says why).
class FileLock {
 public:
  explicit FileLock(const fs::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

std::optional<fs::file_time_type> written_at(const fs::path& path) {
  std::error_code ec;
  const fs::file_time_type t = fs::last_write_time(path, ec);
  return ec ? std::nullopt : std::optional(t);
}

double age_seconds(const fs::path& path) {
  const std::optional<fs::file_time_type> t = written_at(path);
  if (!t) return 0;
  return std::chrono::duration<double>(fs::file_time_type::clock::now() - *t).count();
}

}  // namespace

Calibration measure_once(const fs::path& path, int threads,
                         const std::function<Calibration()>& measure) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const std::optional<fs::file_time_type> before = written_at(path);
  const FileLock one_at_a_time(fs::path(path) += ".lock");
  if (const std::optional<fs::file_time_type> now = written_at(path); now && now != before) {
    try {
      return load_calibration(path, threads);  // another process measured while this one waited
    } catch (const IoError&) {
      // (unusable after all: measured here)
    }
  }
  Calibration c = measure();
  save_calibration(path, c);
  return c;
}

const Calibration& machine_calibration(std::FILE* note) {
  static std::mutex mutex;
  static std::map<fs::path, Calibration> known;  // by cache file: CPU, cap, threads
  const int threads = omp_get_max_threads();
  const fs::path path = calibration_cache_path(threads);
  std::lock_guard lock(mutex);
  if (auto it = known.find(path); it != known.end()) return it->second;
  std::string why;
  if (fs::exists(path)) {
    try {
      Calibration cached = load_calibration(path, threads);
      // Looking at the machine (100 ms) only where a quiet one would measure again: a busy
      // file at least kBusyCalibrationKeptSeconds old.
      const double age = age_seconds(path);
      if (!calibration_remeasure(cached, 0.0, age)) return known[path] = std::move(cached);
      // Measured while other work ran: keep using it while the machine is still busy (a machine
      // that always is would otherwise calibrate on every run), measure again once it is quiet.
      const cpu::OtherLoad now;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!calibration_remeasure(cached, now.cpus(), age)) return known[path] = std::move(cached);
      why = fmt::format(" ({} was measured while other work kept {:.1f} CPUs busy; the machine "
                        "is quiet now)", path.string(), cached.other_cpus);
    } catch (const IoError& e) {
      // The cache is derived data: a damaged file is replaced, not something to fix by hand.
      why = fmt::format(" ({} is unusable: {})", path.string(), e.what());
    }
  }
  bool measured = false;
  Calibration c = measure_once(path, threads, [&] {
    if (note)
      std::fprintf(note,
                   "memfit: calibrating this CPU for step-time estimates, once (`memfit "
                   "calibrate` reruns it)%s\n",
                   why.c_str());
    measured = true;
    return calibrate();
  });
  if (note && measured && c.busy())
    std::fprintf(note,
                 "memfit: other work kept %.1f of %d CPUs busy while calibrating, so step-time "
                 "estimates may be too slow; measured again once the machine is quiet\n",
                 c.other_cpus, cpu::online_cpus());
  return known[path] = std::move(c);
}

}  // namespace memfit
