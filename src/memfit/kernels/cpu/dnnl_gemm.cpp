// oneDNN matmul primitives (2.x API) built once per GEMM shape and cached. Transposes and
// leading dimensions are expressed as memory-descriptor strides, so no operand is copied;
// beta = 1 is the `sum` post-op, alpha an output scale, bias the matmul bias argument.
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/kernel_times.h"

#include <dnnl.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "memfit/core/cpu.h"
#include "memfit/core/error.h"

// Evaluates a oneDNN call; a dnnl::error becomes a memfit::Error that quotes the call.
#define MEMFIT_DNNL(...)                                                                       \
  [&]() -> decltype(auto) {                                                                    \
    try {                                                                                      \
      return __VA_ARGS__;                                                                      \
    } catch (const dnnl::error& e) {                                                           \
      MEMFIT_THROW(Error, "matmul", "oneDNN call `{}` failed: {} (status {})", #__VA_ARGS__,   \
                   e.what(), static_cast<int>(e.status));                                      \
    }                                                                                          \
  }()

namespace memfit::kernels::dnnl_gemm {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

struct SpecHash {
  size_t operator()(const GemmSpec& s) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (int64_t v : {s.M, s.N, s.K, s.lda, s.ldb, s.ldc}) mix(static_cast<uint64_t>(v));
    uint32_t alpha, beta;
    std::memcpy(&alpha, &s.alpha, 4);
    std::memcpy(&beta, &s.beta, 4);
    mix((uint64_t{alpha} << 32) | beta);
    mix(uint64_t{s.trans_a} | uint64_t{s.trans_b} << 1 | uint64_t{s.bias} << 2 |
        uint64_t(s.a_type) << 8 | uint64_t(s.b_type) << 16 | uint64_t(s.c_type) << 24 |
        uint64_t(s.bias_type) << 32 | uint64_t(s.kernel) << 40);
    return h;
  }
};

struct Entry {
  dnnl::memory::desc a_md, b_md, c_md, bias_md, scratch_md;
  dnnl::matmul prim;
  std::string impl;
};

// oneDNN's ceiling for memfit's: MEMFIT_MAX_ISA=avx2 must make oneDNN run as on an AVX2 CPU
// too (no bf16 matmul, AVX2 kernels), or the cap would test nothing of the GEMMs.
dnnl::cpu_isa dnnl_cap(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::scalar: return dnnl::cpu_isa::sse41;
    case cpu::Isa::avx2: return dnnl::cpu_isa::avx2;
    case cpu::Isa::avx512: return dnnl::cpu_isa::avx512_core;
    case cpu::Isa::avx512_bf16: return dnnl::cpu_isa::avx512_core_bf16;
    case cpu::Isa::amx: break;
  }
  return dnnl::cpu_isa::all;
}

// Applies the cap before oneDNN first looks at the CPU (it may be set only once, then). oneDNN's
// ISA values are bit sets of features, so "at most the cap" is "no feature outside it".
void apply_isa_cap() {
  if (!cpu::capped()) return;
  const auto want = static_cast<unsigned>(dnnl_cap(cpu::max_isa()));
  if (dnnl::set_max_cpu_isa(static_cast<dnnl::cpu_isa>(want)) == dnnl::status::success) return;
  // Refused: ONEDNN_MAX_CPU_ISA or an earlier query fixed it first. Fine if it is no higher.
  const auto now = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  MEMFIT_CHECK((now & ~want) == 0, "matmul",
               "cannot cap oneDNN at MEMFIT_MAX_ISA={}: its ISA was fixed at {:#x} already "
               "(ONEDNN_MAX_CPU_ISA?)",
               cpu::isa_name(cpu::max_isa()), now);
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine = [] {
    apply_isa_cap();
    return MEMFIT_DNNL(dnnl::engine(dnnl::engine::kind::cpu, 0));
  }();
  return engine;
}

// Streams are not thread-safe; primitives are, so each thread runs them on its own stream.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream = MEMFIT_DNNL(dnnl::stream(cpu_engine()));
  return stream;
}

// The calling thread's oneDNN scratch, grown to the largest primitive it has run (about 1 MB for
// the model's shapes). Outside the tracking pool: kernels have no pool; see the notes.
void* thread_scratch(size_t bytes) {
  struct Aligned {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Aligned> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    capacity = (bytes + 4095) / 4096 * 4096;
    buffer.reset(std::aligned_alloc(4096, capacity));
    MEMFIT_CHECK(buffer != nullptr, "matmul", "cannot allocate {} bytes of oneDNN scratch",
                 capacity);
  }
  return buffer.get();
}

dt to_dnnl(DType t) {
  switch (t) {
    case DType::f32: return dt::f32;
    case DType::bf16: return dt::bf16;
    case DType::f16: return dt::f16;  // oneDNN 2.6 builds no CPU f16 matmul; it says so
    default: MEMFIT_THROW(DTypeError, "matmul", "no GEMM for {} operands", dtype_name(t));
  }
}

// MEMFIT_GEMM_KERNEL, read once (Note [GEMM kernel]).
KernelRule rule_from_env() {
  static const KernelRule rule = kernel_rule_from_env(std::getenv("MEMFIT_GEMM_KERNEL"));
  return rule;
}

// memfit's rule (Note [GEMM kernel]): oneDNN's GEMM-based kernel for f32 products, and for bf16
// weight gradients where oneDNN's first choice (`first_impl`) is not an AMX kernel; its first
// choice for the other bf16 products.
bool takes_gemm_kernel(const GemmSpec& s, std::string_view first_impl, KernelRule rule) {
  if (rule == KernelRule::first) return false;
  const bool f32 = s.a_type == DType::f32 && s.b_type == DType::f32;
  const bool bf16 = s.a_type == DType::bf16 && s.b_type == DType::bf16;
  const bool amx = first_impl.find("amx") != std::string_view::npos;
  return f32 || (bf16 && s.trans_a && (!amx || rule == KernelRule::jit_weight_gradients));
}

std::shared_ptr<const Entry> build(const GemmSpec& s) {
  auto e = std::make_shared<Entry>();
  // Row-major (rows, cols) with row stride ld; a transposed operand swaps the strides.
  e->a_md = MEMFIT_DNNL(dnnl::memory::desc(dims{s.M, s.K}, to_dnnl(s.a_type),
                                           s.trans_a ? dims{1, s.lda} : dims{s.lda, 1}));
  e->b_md = MEMFIT_DNNL(dnnl::memory::desc(dims{s.K, s.N}, to_dnnl(s.b_type),
                                           s.trans_b ? dims{1, s.ldb} : dims{s.ldb, 1}));
  e->c_md = MEMFIT_DNNL(dnnl::memory::desc(dims{s.M, s.N}, to_dnnl(s.c_type), dims{s.ldc, 1}));
  if (s.bias)
    e->bias_md = MEMFIT_DNNL(dnnl::memory::desc(dims{1, s.N}, to_dnnl(s.bias_type), dims{s.N, 1}));

  dnnl::primitive_attr attr;
  // The library-managed scratchpad is shared by primitives running on different threads (unless
  // oneDNN is built with DNNL_ENABLE_CONCURRENT_EXEC), which corrupted concurrent GEMMs
  // (Gemm.ConcurrentCallersAgree failed about one run in three). Each call passes its thread's
  // own scratch instead: see thread_scratch().
  MEMFIT_DNNL(attr.set_scratchpad_mode(dnnl::scratchpad_mode::user));
  if (s.alpha != 1.0f) MEMFIT_DNNL(attr.set_output_scales(0, {s.alpha}));
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    MEMFIT_DNNL(ops.append_sum(s.beta));
    MEMFIT_DNNL(attr.set_post_ops(ops));
  }
  auto desc = s.bias ? MEMFIT_DNNL(dnnl::matmul::desc(e->a_md, e->b_md, e->bias_md, e->c_md))
                     : MEMFIT_DNNL(dnnl::matmul::desc(e->a_md, e->b_md, e->c_md));
  auto pd = MEMFIT_DNNL(dnnl::matmul::primitive_desc(desc, attr, cpu_engine()));
  // Note [GEMM kernel]: oneDNN 2.6's first choice for f32 on AVX-512 is its brgemm matmul. Its
  // GEMM-based kernel (gemm:jit) made the gpt2 8 x 256 FP32 step 0.80x, 0.94x and 0.86x as long
  // in three interleaved runs on a 16-core Sapphire Rapids, and 0.89x and 0.91x on a 2-core Zen 5
  // (docs/benchmarks.md, "GEMM kernels: oneDNN's gemm:jit over brgemm"). brgemm copies an
  // untransposed B into blocks; it ran the MLP down projection's backward, whose B rows are
  // 3072 floats, at 0.6 TFLOP/s on the Xeon against 1.1-1.2 in gemm:jit. Below AVX-512 gemm:jit
  // is oneDNN's first choice anyway.
  // bf16 keeps oneDNN's first choice, except for the weight gradients (A read transposed: dW +=
  // dY^T X) where that choice is not AMX. On a Zen 5 (AVX512_BF16, where both kernels multiply
  // with the same instructions) gemm:jit ran them 5-21% faster inside the bf16 step, the LM
  // head's 50304 x C x 512 the most; the gpt2 8 x 256 step, the 6 x 384 one and the main job
  // took 0.95x as long (docs/benchmarks.md, "bf16 weight gradients in gemm:jit"). On AMX,
  // brgemm's tiles stay, measured (bench/device/bf16_dweight_check.sh on a 16-core Sapphire
  // Rapids, 2026-11-28): gemm:jit ran most weight gradients faster alone (`BM_Gemm_StepKernels`)
  // but inside the step it gained nothing (gpt2 8 x 256 bf16 0.996x, 6 x 384 1.004x; the LM
  // head's 52 -> 65 ms a step), and it took the resident set beyond the pool from 25 to 207 MiB.
  // (gemm:jit keeps data below the stack pointer: signals must not land on a computing thread,
  // Note [Signals on their own thread].)
  // Its cost in memory: it asks for no scratchpad but mallocs its packing buffers on each call,
  // outside the pool: the resident set beyond the pool's account (`outside_pool_bytes`) grew
  // from 15 to 36 MiB for fp32 gpt2 on 2 threads and from 56 to 112 MiB on 16; for bf16 gpt2 on
  // 2 threads from 15 to 67 MiB. MEMFIT_GEMM_KERNEL=first takes oneDNN's choice for every
  // product, and MEMFIT_GEMM_KERNEL=jit-weight-gradients drops the AMX exception, for A/B runs.
  const bool want_gemm = s.kernel == GemmSpec::Kernel::automatic
                             ? takes_gemm_kernel(s, MEMFIT_DNNL(pd.impl_info_str()),
                                                 rule_from_env())
                             : s.kernel == GemmSpec::Kernel::gemm;
  if (want_gemm) {  // walk oneDNN's list to its GEMM-based kernel; none: its first choice
    auto is_gemm = [](const dnnl::matmul::primitive_desc& p) {
      return std::string_view(MEMFIT_DNNL(p.impl_info_str())).starts_with("gemm:");
    };
    auto it = pd;
    while (!is_gemm(it) && MEMFIT_DNNL(it.next_impl())) {
    }
    if (is_gemm(it)) pd = it;
  }
  e->impl = MEMFIT_DNNL(pd.impl_info_str());
  e->scratch_md = MEMFIT_DNNL(pd.scratchpad_desc());
  e->prim = MEMFIT_DNNL(dnnl::matmul(pd));
  return e;
}

class Cache {
 public:
  std::shared_ptr<const Entry> get(const GemmSpec& s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(s);
    if (it != map_.end()) return it->second;
    auto e = build(s);  // under the lock: a shape is built once, by one thread
    map_.emplace(s, e);
    return e;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

 private:
  std::mutex mu_;
  std::unordered_map<GemmSpec, std::shared_ptr<const Entry>, SpecHash> map_;
};

Cache& cache() {
  static Cache c;
  return c;
}

// K = 0: the product is empty, so C = beta * C (+ bias). oneDNN is not asked about it.
void execute_empty_k(const GemmSpec& s, void* C, const void* bias) {
  MEMFIT_CHECK_DTYPE(s.c_type == DType::f32 || s.c_type == DType::bf16, "matmul",
                     "K = 0 needs an f32 or bf16 output, got {}", dtype_name(s.c_type));
  auto bias_at = [&](int64_t j) -> float {
    if (!bias) return 0.0f;
    return s.bias_type == DType::f32 ? static_cast<const float*>(bias)[j]
                                     : f32_from_bf16(static_cast<const uint16_t*>(bias)[j]);
  };
  for (int64_t i = 0; i < s.M; ++i) {
    if (s.c_type == DType::f32) {
      float* c = static_cast<float*>(C) + i * s.ldc;
      for (int64_t j = 0; j < s.N; ++j) c[j] = (s.beta != 0.0f ? s.beta * c[j] : 0.0f) + bias_at(j);
    } else {
      uint16_t* c = static_cast<uint16_t*>(C) + i * s.ldc;
      for (int64_t j = 0; j < s.N; ++j)
        c[j] = bf16_from_f32((s.beta != 0.0f ? s.beta * f32_from_bf16(c[j]) : 0.0f) + bias_at(j));
    }
  }
}

// A GEMM's name in the kernel times (Note [Kernel times]): its types, shape and form, so that
// each of a model's matmuls has its own rate, e.g. "gemm bf16 -> f32 2048x768x3072 A^T +=".
std::string gemm_label(const GemmSpec& s) {
  const std::string types = s.b_type == s.a_type ? fmt::format("{}", dtype_name(s.a_type))
                            : fmt::format("{},{}", dtype_name(s.a_type), dtype_name(s.b_type));
  return fmt::format("gemm {} -> {} {}x{}x{}{}{}{}{}", types, dtype_name(s.c_type), s.M, s.N, s.K,
                     s.trans_a ? " A^T" : "", s.trans_b ? " B^T" : "", s.beta != 0.0f ? " +=" : "",
                     s.bias ? " +bias" : "");
}

}  // namespace

void execute(const GemmSpec& s, const void* A, const void* B, void* C, const void* bias) {
  if (s.M == 0 || s.N == 0) return;
  KernelScope timed(kernel_times_on() ? gemm_label(s) : std::string(),
                    2.0 * double(s.M) * double(s.N) * double(s.K));
  if (s.K == 0) return execute_empty_k(s, C, bias);
  std::shared_ptr<const Entry> e = cache().get(s);
  dnnl::engine& eng = cpu_engine();
  // oneDNN takes non-const handles; it only reads A, B and bias.
  dnnl::memory a = MEMFIT_DNNL(dnnl::memory(e->a_md, eng, const_cast<void*>(A)));
  dnnl::memory b = MEMFIT_DNNL(dnnl::memory(e->b_md, eng, const_cast<void*>(B)));
  dnnl::memory c = MEMFIT_DNNL(dnnl::memory(e->c_md, eng, C));
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (s.bias) {
    MEMFIT_CHECK(bias != nullptr, "matmul", "GEMM built with a bias was given none");
    args.emplace(DNNL_ARG_BIAS,
                 MEMFIT_DNNL(dnnl::memory(e->bias_md, eng, const_cast<void*>(bias))));
  }
  if (const size_t bytes = e->scratch_md.get_size(); bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 MEMFIT_DNNL(dnnl::memory(e->scratch_md, eng, thread_scratch(bytes))));
  dnnl::stream& stream = thread_stream();
  MEMFIT_DNNL(e->prim.execute(stream, args));
  MEMFIT_DNNL(stream.wait());
}

bool bf16_native() {
  static const bool available = [] {
    cpu_engine();  // the cap first
    // Plain AVX-512 builds one too, emulated and 3x slower than f32 (dnnl_gemm.h): not native.
    if (!cpu::has(cpu::Isa::avx512_bf16)) return false;
    const dnnl::memory::desc md(dims{16, 16}, dt::bf16, dims{16, 1});
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;  // "could not create a primitive descriptor iterator": no bf16 matmul here
    }
  }();
  return available;
}

const char* isa() {
  cpu_engine();
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

KernelRule kernel_rule_from_env(const char* value) {
  const std::string_view v = value ? value : "";
  if (v.empty() || v == "auto") return KernelRule::automatic;
  if (v == "first") return KernelRule::first;
  if (v == "jit-weight-gradients") return KernelRule::jit_weight_gradients;
  MEMFIT_THROW(ConfigError, "matmul",
               "MEMFIT_GEMM_KERNEL must be auto (the default: oneDNN's GEMM-based kernel for "
               "f32 and for bf16 weight gradients below AMX, its first choice for the rest), "
               "first (its first choice for every product) or jit-weight-gradients (the default "
               "with bf16 weight gradients in the GEMM-based kernel on AMX too), got '{}'",
               v);
}

size_t cache_size() { return cache().size(); }

const char* implementation(const GemmSpec& spec) { return cache().get(spec)->impl.c_str(); }

size_t scratch_bytes(const GemmSpec& spec) { return cache().get(spec)->scratch_md.get_size(); }

}  // namespace memfit::kernels::dnnl_gemm
