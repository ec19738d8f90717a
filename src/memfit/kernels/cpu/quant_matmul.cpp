// The tiled matmuls of a quantized weight: dequantize a tile of W into the scratch (on the
// OpenMP team), multiply it with oneDNN, next tile. See Note [NF4 weights], "Tiles".
#include "memfit/kernels/cpu/quant_matmul.h"
#include "memfit/kernels/kernel_times.h"

#include <omp.h>

#include <algorithm>
#include <string_view>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/memory/pool.h"

namespace memfit::kernels {
namespace {

// How the products run: the f32 GEMM on f32 tiles; oneDNN's bf16 GEMM on bf16 tiles; or bf16
// numbers through the f32 GEMM (widened input, bf16-rounded f32 tiles).
enum class Route : uint8_t { f32, bf16, widened };

Route route_for(DType compute, const char* op) {
  MEMFIT_CHECK_DTYPE(compute == DType::f32 || compute == DType::bf16, op,
                     "the input must be f32 or bf16, got {}", dtype_name(compute));
  if (compute == DType::f32) return Route::f32;
  return matmul_widens(DType::bf16) ? Route::widened : Route::bf16;
}

size_t block(int64_t elements, size_t esize) {
  return MemoryPool::round_up(static_cast<size_t>(elements) * esize);
}

// Scratch of one product: `input` elements to widen (R x K), a tile of `tile` elements, an f32
// output tile of R x `out_cols`.
size_t route_bytes(Route r, int64_t input, int64_t tile, int64_t out_tile) {
  switch (r) {
    case Route::f32: return block(tile, 4);
    case Route::bf16: return block(tile, 2);
    case Route::widened: return block(input, 4) + block(tile, 4) + block(out_tile, 4);
  }
  return 0;
}

size_t forward_bytes(Route r, int64_t R, int64_t IC, int64_t OC) {
  const int64_t t = std::min(OC, kQuantTileRows);
  return route_bytes(r, R * IC, t * IC, R * t);
}
size_t backward_bytes(Route r, int64_t R, int64_t IC, int64_t OC) {
  const int64_t t = std::min(IC, kQuantTileCols);
  return route_bytes(r, R * OC, OC * t, R * t);
}

// Consecutive regions of the scratch, each aligned like a pool block.
class Carver {
 public:
  Carver(Tensor& scratch, size_t need, const char* op) {
    MEMFIT_CHECK(scratch.defined() && scratch.is_contiguous(), op,
                 "scratch must be a defined contiguous tensor");
    MEMFIT_CHECK_SHAPE(scratch.nbytes() >= need, op, "scratch of {} bytes is too small: {} needed",
                       scratch.nbytes(), need);
    base_ = static_cast<char*>(scratch.raw_data());
  }
  void* take(int64_t elements, size_t esize) {
    void* p = base_ + used_;
    used_ += block(elements, esize);
    return p;
  }

 private:
  char* base_ = nullptr;
  size_t used_ = 0;
};

// The checks shared by both products: `in` (N..., K) of f32 or bf16, `out` (N..., M) of the
// types the compute allows. Returns R.
int64_t check_product(const char* op, const Tensor& in, const char* in_name, int64_t K,
                      const Tensor& out, const char* out_name, int64_t M) {
  const Shape& s = expect_float_any_shape(in, op, in_name);
  MEMFIT_CHECK_SHAPE(s.rank() >= 1 && s[-1] == K, op, "{} {} must end in {} (the weight's {})",
                     in_name, s, K, in_name[0] == 'i' ? "columns" : "rows");
  Shape want = s;
  want[-1] = M;
  const Shape& o = expect_float_any_shape(out, op, out_name);
  MEMFIT_CHECK_SHAPE(o == want, op, "{} {} must be {}", out_name, o, want);
  const bool f32 = in.dtype() == DType::f32;
  MEMFIT_CHECK_DTYPE(f32 ? out.dtype() == DType::f32 : out.dtype() != DType::f16, op,
                     "{} {} computes {} as {}: f32 gives f32, bf16 gives f32 or bf16", in_name,
                     dtype_name(in.dtype()), out_name, dtype_name(out.dtype()));
  return in.numel() / K;
}

// Rows [r0, r0 + t) of W into tile (t x cols) as `type`, on the team.
void dequantize_row_tile(const QuantWeight& w, int64_t r0, int64_t t, DType type, bool round,
                         void* tile) {
  const size_t esize = dtype_size(type);
  const int64_t cols = w.cols();
  parallel_ranges(t * cols, [&](int64_t b, int64_t e) {
    quant_dequantize_n(w, r0 * cols + b, e - b, type, static_cast<char*>(tile) + b * esize,
                       round);
  });
}

// Columns [c0, c0 + t) of every row of W into tile (rows x t) as `type`, on the team.
void dequantize_col_tile(const QuantWeight& w, int64_t c0, int64_t t, DType type, bool round,
                         void* tile) {
  const size_t esize = dtype_size(type);
  const int64_t rows = w.rows();
#pragma omp parallel if (rows * t > kParallelGrain)
  {  // a contiguous range of rows per thread, one dispatch each
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t r0 = rows * tid / nth, r1 = rows * (tid + 1) / nth;
    quant_dequantize_tile(w, r0, r1, c0, c0 + t, type, static_cast<char*>(tile) + r0 * t * esize,
                          round);
  }
}

// C (R x n, row stride ldc, `c_type`) = A (R x K, lda) @ op(B) with bf16 A and B.
void bf16_gemm(int64_t R, int64_t n, int64_t K, bool trans_b, const void* A, int64_t lda,
               const void* B, int64_t ldb, DType c_type, void* C, int64_t ldc) {
  dnnl_gemm::GemmSpec s;
  s.M = R, s.N = n, s.K = K;
  s.trans_b = trans_b;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.a_type = s.b_type = DType::bf16;
  s.c_type = c_type;
  dnnl_gemm::execute(s, A, B, C);
}

// Rows of y (R x n f32, dense) into columns [c0, c0 + n) of out (R x ld, bf16), rounded.
void round_columns(const float* y, int64_t R, int64_t n, void* out, int64_t ld, int64_t c0) {
#pragma omp parallel for schedule(static) if (R * n > kParallelGrain)
  for (int64_t i = 0; i < R; ++i)
    convert_n(DType::f32, DType::bf16, static_cast<uint16_t*>(out) + i * ld + c0, y + i * n, n);
}

// The op's name in errors and kernel times: the format's ("nf4_matmul_forward").
const char* op_name(const QuantWeight& w, std::string_view which) {
  const bool nf4 = w.format == WeightQuant::nf4;
  if (which == "forward") return nf4 ? "nf4_matmul_forward" : "int8_matmul_forward";
  return nf4 ? "nf4_matmul_backward_input" : "int8_matmul_backward_input";
}

}  // namespace

size_t quant_matmul_scratch_bytes(int64_t R, int64_t IC, int64_t OC, DType compute) {
  const Route r = route_for(compute, "quant_matmul");
  return std::max(forward_bytes(r, R, IC, OC), backward_bytes(r, R, IC, OC));
}

void quant_matmul_forward(Tensor& out, const Tensor& inp, const QuantWeight& w, Tensor& scratch) {
  const char* op = op_name(w, "forward");
  KernelScope timed(op);
  MEMFIT_CHECK(w.defined(), op, "the weight is undefined");
  const int64_t IC = w.cols(), OC = w.rows();
  const int64_t R = check_product(op, inp, "inp", IC, out, "out", OC);
  const Route route = route_for(inp.dtype(), op);
  Carver c(scratch, quant_matmul_scratch_bytes(R, IC, OC, inp.dtype()), op);
  if (R == 0) return;
  const DType out_type = out.dtype();
  char* y = static_cast<char*>(out.raw_data());
  const size_t out_size = dtype_size(out_type);
  const float* x = nullptr;
  if (route == Route::widened) {
    float* xw = static_cast<float*>(c.take(R * IC, 4));
    convert_n_team(DType::bf16, DType::f32, xw, inp.raw_data(), R * IC);
    x = xw;
  } else if (route == Route::f32) {
    x = inp.data<float>();
  }
  const DType tile_type = route == Route::bf16 ? DType::bf16 : DType::f32;
  void* tile = c.take(std::min(OC, kQuantTileRows) * IC, dtype_size(tile_type));
  float* ytile = route == Route::widened && out_type == DType::bf16
                     ? static_cast<float*>(c.take(R * std::min(OC, kQuantTileRows), 4))
                     : nullptr;
  for (int64_t r0 = 0; r0 < OC; r0 += kQuantTileRows) {
    const int64_t t = std::min(kQuantTileRows, OC - r0);
    dequantize_row_tile(w, r0, t, tile_type, route == Route::widened, tile);
    // out[:, r0:r0+t] = x @ tile^T
    if (route == Route::bf16) {
      bf16_gemm(R, t, IC, true, inp.raw_data(), IC, tile, IC, out_type, y + r0 * out_size, OC);
    } else if (ytile) {
      gemm(false, true, R, t, IC, 1.0f, x, IC, static_cast<const float*>(tile), IC, 0.0f, ytile,
           t);
      round_columns(ytile, R, t, y, OC, r0);
    } else {
      gemm(false, true, R, t, IC, 1.0f, x, IC, static_cast<const float*>(tile), IC, 0.0f,
           reinterpret_cast<float*>(y) + r0, OC);
    }
  }
}

void quant_matmul_backward_input(Tensor& dinp, const Tensor& dout, const QuantWeight& w,
                                 Tensor& scratch) {
  const char* op = op_name(w, "backward_input");
  KernelScope timed(op);
  MEMFIT_CHECK(w.defined(), op, "the weight is undefined");
  const int64_t IC = w.cols(), OC = w.rows();
  const int64_t R = check_product(op, dout, "dout", OC, dinp, "dinp", IC);
  const Route route = route_for(dout.dtype(), op);
  Carver c(scratch, quant_matmul_scratch_bytes(R, IC, OC, dout.dtype()), op);
  if (R == 0) return;
  const DType out_type = dinp.dtype();
  char* dx = static_cast<char*>(dinp.raw_data());
  const size_t out_size = dtype_size(out_type);
  const float* g = nullptr;
  if (route == Route::widened) {
    float* gw = static_cast<float*>(c.take(R * OC, 4));
    convert_n_team(DType::bf16, DType::f32, gw, dout.raw_data(), R * OC);
    g = gw;
  } else if (route == Route::f32) {
    g = dout.data<float>();
  }
  const DType tile_type = route == Route::bf16 ? DType::bf16 : DType::f32;
  void* tile = c.take(OC * std::min(IC, kQuantTileCols), dtype_size(tile_type));
  float* ytile = route == Route::widened && out_type == DType::bf16
                     ? static_cast<float*>(c.take(R * std::min(IC, kQuantTileCols), 4))
                     : nullptr;
  for (int64_t c0 = 0; c0 < IC; c0 += kQuantTileCols) {
    const int64_t t = std::min(kQuantTileCols, IC - c0);
    dequantize_col_tile(w, c0, t, tile_type, route == Route::widened, tile);
    // dinp[:, c0:c0+t] = dout @ tile: every output column once, over all of K = OC.
    if (route == Route::bf16) {
      bf16_gemm(R, t, OC, false, dout.raw_data(), OC, tile, t, out_type, dx + c0 * out_size, IC);
    } else if (ytile) {
      gemm(false, false, R, t, OC, 1.0f, g, OC, static_cast<const float*>(tile), t, 0.0f, ytile,
           t);
      round_columns(ytile, R, t, dx, IC, c0);
    } else {
      gemm(false, false, R, t, OC, 1.0f, g, OC, static_cast<const float*>(tile), t, 0.0f,
           reinterpret_cast<float*>(dx) + c0, IC);
    }
  }
}

}  // namespace memfit::kernels
