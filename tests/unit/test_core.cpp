#include <gtest/gtest.h>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/tensor.h"
#include "titan/core/threads.h"

namespace titan {
namespace {

TEST(Allocator, ChargesAndReleasesPerCategory) {
  const MemoryStats before = memory_stats();
  const int act = static_cast<int>(MemCategory::activations);
  {
    Tensor t = Tensor::zeros({3, 5}, DType::f32, MemCategory::activations);
    const MemoryStats during = memory_stats();
    EXPECT_EQ(during.current[act] - before.current[act], 60u);
    EXPECT_GE(during.peak[act], during.current[act]);
    EXPECT_EQ(t.data<float>()[14], 0.0f);
  }
  EXPECT_EQ(memory_stats().current[act], before.current[act]);
}

TEST(Tensor, ReshapeAndNarrow) {
  Tensor t = Tensor::empty({4, 6}, DType::f32, MemCategory::other);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor rows = t.narrow0(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(rows.data<float>()[0], 6.0f);
  EXPECT_EQ(t.reshape({2, 12}).size(1), 12);
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.narrow0(3, 2), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32, MemCategory::other), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values; ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_EQ(f16_to_f32(f32_to_f16(0.333251953125f)), 0.333251953125f);
}

TEST(Threads, RejectsZero) {
  EXPECT_THROW(set_thread_count(0), Error);
}

}  // namespace
}  // namespace titan
