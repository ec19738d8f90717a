// Flash attention's API: argument checks (typed errors naming the op, the shapes and the heads),
// the workspace sizes and thread counts, and dispatch to the f32 and bf16 drivers
// (flash_attention_f32.cpp, flash_attention_bf16.cpp). See "Note [Flash attention]" in
// docs/notes/flash-attention.md.
#include "memfit/kernels/cpu/flash_attention.h"
#include "memfit/kernels/kernel_times.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/flash_attention_detail.h"

namespace memfit::kernels {
namespace {

using flash::Dims;
using flash::kLanes;

constexpr std::string_view kForward = "flash_attention_forward";
constexpr std::string_view kBackward = "flash_attention_backward";

bool tile_ok(int n) { return n >= kLanes && n <= 512 && n % kLanes == 0; }

// "n_head = 12", or "8 query heads and 2 key/value heads", for error messages.
std::string heads_text(const AttentionHeads& heads) {
  return heads.q == heads.kv
             ? fmt::format("n_head = {}", heads.q)
             : fmt::format("{} query heads and {} key/value heads", heads.q, heads.kv);
}

void check_heads(const AttentionHeads& heads, std::string_view op) {
  MEMFIT_CHECK_SHAPE(heads.q > 0 && heads.kv > 0 && heads.q % heads.kv == 0, op,
                     "{} key/value heads must divide {} query heads", heads.kv, heads.q);
}

// C is the output width, heads.q * hs.
Dims make_dims(int64_t B, int64_t T, int64_t C, AttentionHeads heads, DType dtype,
               const FlashAttentionTiles& tiles, std::string_view op) {
  check_heads(heads, op);
  MEMFIT_CHECK_SHAPE(C % heads.q == 0, op, "C = {} is not a positive multiple of {}", C,
                     heads_text(heads));
  MEMFIT_CHECK_DTYPE(dtype == DType::f32 || dtype == DType::bf16, op,
                     "qkv must be f32 or bf16, got {}", dtype_name(dtype));
  MEMFIT_CHECK(tile_ok(tiles.q_rows) && tile_ok(tiles.kv_rows), op,
               "tile rows must be multiples of {} in [{}, 512], got q_rows {} kv_rows {}", kLanes,
               kLanes, tiles.q_rows, tiles.kv_rows);
  Dims d;
  d.B = B;
  d.T = T;
  d.C = C;
  d.NH = heads.q;
  d.KV = heads.kv;
  d.hs = C / heads.q;
  d.Br = tiles.q_rows;
  d.Bc = tiles.kv_rows;
  d.bf16 = dtype == DType::bf16;
  MEMFIT_CHECK_SHAPE(!d.bf16 || d.hs % 2 == 0, op,
                     "bf16 needs an even head size, got C = {}, {} (head size {})", C,
                     heads_text(heads), d.hs);
  return d;
}

// qkv (B, T, heads.qkv_width(hs)): (B, T, 3C) for multi-head attention.
Dims check_qkv(const Tensor& qkv, AttentionHeads heads, const FlashAttentionTiles& tiles,
               std::string_view op) {
  MEMFIT_CHECK(qkv.defined(), op, "qkv is undefined");
  const DType dt = qkv.dtype();
  MEMFIT_CHECK_DTYPE(dt == DType::f32 || dt == DType::bf16, op,
                     "qkv must be f32 or bf16, got {} {}", dtype_name(dt), qkv.shape());
  const Shape& s = expect_any_shape(qkv, op, "qkv", dt);
  MEMFIT_CHECK_SHAPE(heads.q > 0 && heads.kv > 0 && heads.q % heads.kv == 0, op,
                     "{} key/value heads must divide {} query heads (qkv {})", heads.kv, heads.q,
                     s);
  const bool mha = heads.q == heads.kv;
  const int64_t parts = heads.q + 2L * heads.kv;  // head-size columns per token
  MEMFIT_CHECK_SHAPE(
      s.rank() == 3 && s[0] > 0 && s[1] > 0 && s[2] > 0 && s[2] % (mha ? 3 : parts) == 0, op,
      "qkv must be {}, got {}",
      mha ? std::string("(B, T, 3C) with B, T, C > 0")
          : fmt::format("(B, T, (q + 2 kv) * hs) = (B, T, {} hs) with B, T, hs > 0 for {}", parts,
                        heads_text(heads)),
      s);
  return make_dims(s[0], s[1], mha ? s[2] / 3 : s[2] / parts * heads.q, heads, dt, tiles, op);
}

// bf16 rows are read in pairs as uint32 by the tile products.
void check_pair_aligned(const Tensor& t, std::string_view op, std::string_view name) {
  MEMFIT_CHECK_SHAPE(reinterpret_cast<uintptr_t>(t.raw_data()) % 4 == 0, op,
                     "bf16 {} {} must start at an even element", name, t.shape());
}

uint16_t* bf16_data(const Tensor& t) { return static_cast<uint16_t*>(t.raw_data()); }

// The most threads, up to omp_get_max_threads(), whose workspace (need(n) words for n
// threads) fits in `workspace`; throws if not even one thread's does.
template <typename Need>
int threads_that_fit(const Tensor& workspace, std::string_view op, size_t full_bytes,
                     Need&& need) {
  MEMFIT_CHECK(workspace.defined(), op, "workspace is undefined");
  expect_any_shape(workspace, op, "workspace", workspace.dtype());
  const int64_t have = static_cast<int64_t>(workspace.nbytes() / sizeof(float));
  for (int n = omp_get_max_threads(); n >= 1; --n) {
    if (need(n) <= have) return n;
  }
  MEMFIT_CHECK_SHAPE(false, op,
                     "workspace {} ({} bytes) is too small: one thread needs {} bytes, "
                     "{}_workspace_bytes gives {}",
                     workspace.shape(), workspace.nbytes(), need(1) * sizeof(float), op,
                     full_bytes);
  return 0;
}

}  // namespace

namespace flash {

// Enough (group, b, key/value head) tasks that dynamic scheduling keeps every thread busy to
// the end.
constexpr int64_t kTasksPerThread = 4;

int backward_groups(const Dims& d, int nthreads) {
  if (nthreads <= 1) return 1;
  const int64_t want = (kTasksPerThread * nthreads + d.kv_heads() - 1) / d.kv_heads();
  return static_cast<int>(std::clamp<int64_t>(want, 1, d.kv_tiles()));
}

int64_t backward_shared_words(const Dims& d, int groups) {
  // f32 adds group 0 straight into dqkv; bf16 needs an f32 buffer for it too.
  return round_lanes(d.heads() * d.T) + (d.bf16 ? groups : groups - 1) * dq_words(d);
}

int64_t backward_thread_words(const Dims& d) {
  return d.bf16 ? backward_thread_words_bf16(d) : backward_thread_words_f32(d);
}

int64_t forward_thread_words(const Dims& d) {
  return d.bf16 ? forward_thread_words_bf16(d) : forward_thread_words_f32(d);
}

}  // namespace flash

namespace {

int64_t forward_words(const Dims& d, int nthreads) {
  return flash::forward_thread_words(d) * nthreads;
}

int64_t backward_words(const Dims& d, int nthreads) {
  return flash::backward_shared_words(d, flash::backward_groups(d, nthreads)) +
         flash::backward_thread_words(d) * nthreads;
}

}  // namespace

size_t flash_attention_forward_workspace_bytes(int64_t B, int64_t T, int64_t C,
                                               AttentionHeads heads, DType dtype,
                                               const FlashAttentionTiles& tiles) {
  const Dims d = make_dims(B, T, C, heads, dtype, tiles, "flash_attention_forward_workspace");
  return static_cast<size_t>(forward_words(d, omp_get_max_threads())) * sizeof(float);
}

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, Tensor& workspace,
                             AttentionHeads heads, const FlashAttentionTiles& tiles) {
  KernelScope timed("flash_attention_forward");
  const Dims d = check_qkv(qkv, heads, tiles, kForward);
  const DType dt = qkv.dtype();
  expect_tensor(out, kForward, "out", {d.B, d.T, d.C}, dt);
  expect_tensor(lse, kForward, "lse", {d.B, d.NH, d.T}, DType::f32);
  const int nthreads = threads_that_fit(
      workspace, kForward,
      flash_attention_forward_workspace_bytes(d.B, d.T, d.C, heads, dt, tiles),
      [&](int n) { return forward_words(d, n); });
  float* ws = static_cast<float*>(workspace.raw_data());
  if (d.bf16) {
    check_pair_aligned(qkv, kForward, "qkv");
    flash::forward_bf16(d, bf16_data(out), lse.data<float>(), bf16_data(qkv), ws, nthreads);
  } else {
    flash::forward_f32(d, out.data<float>(), lse.data<float>(), qkv.data<float>(), ws, nthreads);
  }
}

size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C,
                                                AttentionHeads heads, DType dtype,
                                                const FlashAttentionTiles& tiles) {
  const Dims d = make_dims(B, T, C, heads, dtype, tiles, "flash_attention_backward_workspace");
  return static_cast<size_t>(backward_words(d, omp_get_max_threads())) * sizeof(float);
}

void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                              const Tensor& out, const Tensor& lse, Tensor& workspace,
                              AttentionHeads heads, const FlashAttentionTiles& tiles) {
  KernelScope timed("flash_attention_backward");
  const Dims d = check_qkv(qkv, heads, tiles, kBackward);
  const DType dt = qkv.dtype();
  expect_tensor(dqkv, kBackward, "dqkv", qkv.shape(), dt);
  expect_tensor(dout, kBackward, "dout", {d.B, d.T, d.C}, dt);
  expect_tensor(out, kBackward, "out", {d.B, d.T, d.C}, dt);
  expect_tensor(lse, kBackward, "lse", {d.B, d.NH, d.T}, DType::f32);
  // As many threads as the workspace holds, up to omp_get_max_threads(); the key-tile groups,
  // and so dq's summation order, follow from that number alone.
  const int nthreads = threads_that_fit(
      workspace, kBackward,
      flash_attention_backward_workspace_bytes(d.B, d.T, d.C, heads, dt, tiles),
      [&](int n) { return backward_words(d, n); });
  const int groups = flash::backward_groups(d, nthreads);
  float* ws = static_cast<float*>(workspace.raw_data());

  if (d.bf16) {
    check_pair_aligned(qkv, kBackward, "qkv");
    check_pair_aligned(dout, kBackward, "dout");
    flash::backward_bf16(d, bf16_data(dqkv), bf16_data(dout), bf16_data(qkv), bf16_data(out),
                         lse.data<float>(), ws, nthreads, groups);
  } else {
    flash::backward_f32(d, dqkv.data<float>(), dout.data<float>(), qkv.data<float>(),
                        out.data<float>(), lse.data<float>(), ws, nthreads, groups);
  }
}

}  // namespace memfit::kernels
