// AMX (Sapphire Rapids' tile unit) for flash attention's bf16 products: TDPBF16PS multiplies
// a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 f32 in one instruction, about ten times
// the f32 FMA rate of the AVX-512 kernels. Linux grants the tile state per process on request;
// each thread configures its tiles inside an AmxScope. The AMX code is compiled into every
// x86-64 build through target attributes and runs only where cpu::has(Isa::amx) (the CPU has
// it and MEMFIT_MAX_ISA allows it) and the OS granted the tile state; elsewhere gemm_bf16 runs
// on AVX512_BF16 or the Highway kernels. See "Note [Flash attention]" and "Note [SIMD
// dispatch]" (docs/notes/simd-dispatch.md). The products see packed tiles only: which head a
// tile came from (grouped-query attention included) is decided once, in the bf16 driver through
// Dims' helpers (flash_attention_detail.h), so the AMX and AVX512_BF16 runs index heads alike.
#include <atomic>
#include <cstdint>

#include "memfit/core/cpu.h"
#include "memfit/kernels/cpu/flash_attention_tiles.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MEMFIT_FLASH_AMX 1
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined" operands (GCC
// PR105593); the warning is reported at the header's lines, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
// The functions that execute tile instructions; nothing else in the build assumes AMX.
#define MEMFIT_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#endif

namespace memfit::kernels::flash {
namespace {

std::atomic<bool> g_amx_allowed{true};
thread_local bool t_amx_active = false;

}  // namespace

void set_amx_allowed(bool allowed) { g_amx_allowed.store(allowed, std::memory_order_relaxed); }
bool amx_active() { return t_amx_active; }

#if defined(MEMFIT_FLASH_AMX)
namespace {

// All eight tile registers 16 rows x 64 bytes: A tiles 16 x 32 bf16, B tiles 16 pairs x 16
// columns, C tiles 16 x 16 f32.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig full_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}

}  // namespace

// C (+)= A B on whole tiles: blocks of 2 x 2 C tiles (tmm0-3) fed by two A tiles (tmm4-5) and
// two B tiles (tmm6-7) per 16 pairs of k.
MEMFIT_AMX_TARGET void gemm_amx(int M, int N, int K2, const uint32_t* A, int64_t lda,
                                const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
                                bool accumulate) {
  const int64_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;
  for (int m0 = 0; m0 < M; m0 += 32) {
    const bool m2 = m0 + 16 < M;
    for (int n0 = 0; n0 < N; n0 += 32) {
      const bool n2 = n0 + 16 < N;
      float* c = C + m0 * ldc + n0;
      if (accumulate) {
        _tile_loadd(0, c, sc);
        if (n2) _tile_loadd(1, c + 16, sc);
        if (m2) _tile_loadd(2, c + 16 * ldc, sc);
        if (m2 && n2) _tile_loadd(3, c + 16 * ldc + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int k = 0; k < K2; k += 16) {
        const uint32_t* a = A + m0 * lda + k;
        const uint32_t* b = B + k * ldb + n0;
        _tile_loadd(4, a, sa);
        _tile_loadd(6, b, sb);
        _tile_dpbf16ps(0, 4, 6);
        if (n2) {
          _tile_loadd(7, b + 16, sb);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (m2) {
          _tile_loadd(5, a + 16 * lda, sa);
          _tile_dpbf16ps(2, 5, 6);
          if (n2) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c, sc);
      if (n2) _tile_stored(1, c + 16, sc);
      if (m2) _tile_stored(2, c + 16 * ldc, sc);
      if (m2 && n2) _tile_stored(3, c + 16 * ldc + 16, sc);
    }
  }
}

namespace {

// Linux hands out the AMX register state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA), once per process; only where the CPU has AMX and the cap allows it.
bool request_amx() {
  static const bool granted = [] {
    if (!cpu::has(cpu::Isa::amx)) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return granted;
}

}  // namespace

bool amx_supported() { return request_amx(); }

namespace {
MEMFIT_AMX_TARGET void tiles_configure(const TileConfig* cfg) { _tile_loadconfig(cfg); }
MEMFIT_AMX_TARGET void tiles_release() { _tile_release(); }
}  // namespace

AmxScope::AmxScope() {
  if (g_amx_allowed.load(std::memory_order_relaxed) && request_amx()) {
    static const TileConfig cfg = full_tiles();
    tiles_configure(&cfg);
    t_amx_active = true;
  }
}

AmxScope::~AmxScope() {
  if (t_amx_active) {
    tiles_release();
    t_amx_active = false;
  }
}
#else
bool amx_supported() { return false; }
AmxScope::AmxScope() {}
AmxScope::~AmxScope() {}
void gemm_amx(int, int, int, const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t,
              bool) {}
#endif  // MEMFIT_FLASH_AMX


}  // namespace memfit::kernels::flash
