#include "memfit/memory/tensor.h"

#include <gtest/gtest.h>

namespace memfit {
namespace {

TEST(Tensor, ViewsShareTheSlab) {
  MemoryPool pool;
  Tensor slab = Tensor::empty(pool, {10, 4}, DType::f32, Category::params, "slab");
  Tensor v = slab.view(8, {2, 4});
  v.data<float>()[0] = 3.0f;
  EXPECT_EQ(slab.data<float>()[8], 3.0f);
  EXPECT_EQ(slab.slice(2, 4).data<float>()[0], 3.0f);
  EXPECT_EQ(pool.live_allocations(), 1u);
  EXPECT_EQ(v.category(), Category::params);
}

TEST(Tensor, ByteViewsGiveASlabOtherDtypes) {
  MemoryPool pool;
  Tensor slab = Tensor::empty(pool, {256}, DType::i8, Category::workspace, "arena");
  Tensor f = slab.view_bytes(64, {4, 4}, DType::f32);
  Tensor h = slab.view_bytes(64, {32}, DType::bf16);
  f.data<float>()[0] = 1.0f;  // 0x3f800000: the bf16 pair (0x0000, 0x3f80)
  EXPECT_EQ(static_cast<uint16_t*>(h.raw_data())[1], 0x3f80);
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.category(), Category::workspace);
  EXPECT_EQ(pool.live_allocations(), 1u);
  EXPECT_THROW(slab.view_bytes(200, {16}, DType::f32), ShapeError);  // past the end
  EXPECT_THROW(slab.view_bytes(2, {4}, DType::f32), ShapeError);     // misaligned
}

TEST(Tensor, StorageOutlivesTheFirstHandle) {
  MemoryPool pool;
  Tensor v;
  {
    Tensor slab = Tensor::empty(pool, {16}, DType::f32, Category::grads, "g");
    v = slab.view(4, {4});
  }
  EXPECT_EQ(pool.live_allocations(), 1u);
  v = Tensor();
  EXPECT_EQ(pool.live_allocations(), 0u);
  EXPECT_EQ(pool.bytes_current(), 0u);
}

TEST(Tensor, WrongDtypeIsATypedError) {
  MemoryPool pool;
  Tensor t = Tensor::empty(pool, {3}, DType::bf16, Category::activations, "x");
  try {
    t.data<float>();
    FAIL() << "expected DTypeError";
  } catch (const DTypeError& e) {
    EXPECT_EQ(e.op(), "tensor");
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ViewPastTheEndIsAShapeError) {
  MemoryPool pool;
  Tensor t = Tensor::empty(pool, {4, 4}, DType::f32, Category::activations, "x");
  EXPECT_THROW(t.view(10, {2, 4}), ShapeError);
  EXPECT_THROW(t.reshape({5, 3}), ShapeError);
  EXPECT_THROW(t.slice(3, 5), ShapeError);
  try {
    t.reshape({5, 3});
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("(4, 4)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(5, 3)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor.cpp"), std::string::npos) << e.what();
  }
}

TEST(Shape, PrintsLikePython) {
  EXPECT_EQ(Shape({8, 256, 768}).to_string(), "(8, 256, 768)");
  EXPECT_EQ(Shape({5}).to_string(), "(5,)");
  EXPECT_EQ(Shape({2, 3, 4}).numel(), 24);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_from_bf16(bf16_from_f32(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3*2^-8 is between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
  EXPECT_EQ(f32_from_bf16(bf16_from_f32(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(f32_from_bf16(bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(NAN))));
  EXPECT_TRUE(std::isinf(f32_from_bf16(bf16_from_f32(INFINITY))));
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
}

}  // namespace
}  // namespace memfit
