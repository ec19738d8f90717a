// RoPE in mixed precision: on a bf16 / f16 qkv the rotation is exactly the f32 kernel's on the
// widened values, rounded once to the storage type (forward and backward), within that type's
// unit roundoff of the double reference, with v untouched to the bit.
#include <gtest/gtest.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/rope.h"
#include "memfit/kernels/ref/rope_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

struct Case {
  int64_t B, T;
  int q, kv;
  int64_t hs;
};

TEST(RopeMixed, HalfIsTheF32RotationRoundedOnce) {
  MemoryPool pool;
  for (Case c : {Case{1, 1, 1, 1, 2}, Case{2, 3, 2, 1, 34}, Case{2, 17, 4, 2, 64},
                 Case{1, 40, 8, 2, 128}}) {
    const AttentionHeads heads(c.q, c.kv);
    const int64_t W = heads.qkv_width(c.hs), qk = (c.q + c.kv) * c.hs;
    const Shape shape{c.B, c.T, W};
    Tensor table = make_tensor(pool, {c.T, c.hs});
    rope_table(table, rope_inv_freq(static_cast<int>(c.hs), 500000.0));
    const std::vector<double> tab = to_doubles(table);
    for (DType t : {DType::bf16, DType::f16}) {
      for (bool backward : {false, true}) {
        SCOPED_TRACE(fmt::format("B{} T{} q{} kv{} hs{} {} {}", c.B, c.T, c.q, c.kv, c.hs,
                                 dtype_name(t), backward ? "backward" : "forward"));
        std::vector<double> x;
        Tensor h = random_any(pool, shape, t, 41, &x);
        Tensor f = make_tensor(pool, shape);
        convert(f, h);
        std::vector<double> want = x;
        if (backward) {
          rope_backward(h, table, heads);
          rope_backward(f, table, heads);
          ref::rope_backward_ref(want.data(), tab.data(), c.B, c.T, c.q, c.kv, c.hs);
        } else {
          rope_forward(h, table, heads);
          rope_forward(f, table, heads);
          ref::rope_forward_ref(want.data(), tab.data(), c.B, c.T, c.q, c.kv, c.hs);
        }
        Tensor f_rounded = make_tensor(pool, shape, t);
        convert(f_rounded, f);
        EXPECT_EQ(std::memcmp(h.raw_data(), f_rounded.raw_data(), h.nbytes()), 0);
        const std::vector<double> got = to_doubles_any(h);
        EXPECT_TRUE(all_close(got, want, unit_roundoff(t), 3e-7));
        for (int64_t r = 0; r < c.B * c.T; ++r)
          for (int64_t i = qk; i < W; ++i) ASSERT_EQ(got[r * W + i], x[r * W + i]);
      }
    }
  }
}

}  // namespace
}  // namespace memfit::kernels
