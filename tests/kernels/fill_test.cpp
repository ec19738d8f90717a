// kernels::zero (kernels/cpu/fill.h): every byte of the tensor cleared and none beside it, for
// sizes on one thread, across the team (past kParallelGrain floats) and with a tail of bytes
// that is not a whole float, on whatever thread count the test runs with and on two.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/parallel.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

TEST(Zero, ClearsEveryByteOfTheTensorAndNoneBesideIt) {
  MemoryPool pool;
  const int64_t big = 4 * kParallelGrain + 7;  // bytes: past the grain, a 3-byte tail
  for (int threads : {omp_get_max_threads(), 2}) {
    for (int64_t bytes : {int64_t{1}, int64_t{5}, int64_t{64}, int64_t{4096} + 3, big * 4 + 3}) {
      SCOPED_TRACE(::testing::Message() << bytes << " bytes on " << threads << " threads");
      // The tensor is an i8 view a few bytes into a larger buffer of 0xAB.
      Tensor whole = make_tensor(pool, {bytes + 32}, DType::i8);
      std::memset(whole.raw_data(), 0xAB, whole.nbytes());
      Tensor t = whole.view(16, {bytes});
      const int before = omp_get_max_threads();
      omp_set_num_threads(threads);
      zero(t);
      omp_set_num_threads(before);
      const auto* p = static_cast<const uint8_t*>(whole.raw_data());
      int64_t wrong = -1;
      for (int64_t i = 0; i < whole.numel() && wrong < 0; ++i) {
        const bool inside = i >= 16 && i < 16 + bytes;
        if (p[i] != (inside ? 0 : 0xAB)) wrong = i;
      }
      EXPECT_EQ(wrong, -1) << "byte " << wrong << " of the buffer (the tensor is [16, "
                           << 16 + bytes << "))";
    }
  }
  Tensor empty = make_tensor(pool, {0});
  zero(empty);  // nothing to do, no error
}

TEST(Zero, AnF32TensorReadsPositiveZero) {
  MemoryPool pool;
  Tensor t = random_tensor(pool, {3, kParallelGrain + 5}, 1);
  zero(t);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = t.data<float>()[i];
    ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << "element " << i << ": " << v;
  }
}

}  // namespace
}  // namespace memfit::kernels
