// LoRA's update (nn/lora.h) against a double-precision computation of its definition: in fp32,
// y += scaling * (x A^T) B^T and its three gradients; in bf16 (mixed precision), the same with
// the operands rounded where LoraLinear documents it -- x, A, B, u = scaling * x A^T, dy and
// du = scaling * dy B -- so the two differ by fp32 summation order only.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "compare.h"
#include "titan/core/dtype.h"
#include "titan/core/rng.h"
#include "titan/dispatch/registry.h"
#include "titan/nn/lora.h"

namespace titan {
namespace {

constexpr int64_t kRows = 37, kIn = 48, kOut = 40, kRank = 8;
constexpr float kScaling = 2.5f;  // not a power of two: rounding after the scaling matters

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng(seed).fill_normal(v.data(), n, 0.0f, 1.0f);
  return v;
}

std::vector<uint16_t> rounded_bits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
  return bits;
}

// A value as the bf16 computation sees it: rounded when `bf16`.
float operand(float v, bool bf16) {
  return bf16 ? round_to_bf16(v) : v;
}

// c (rows, cols) = sum_k a(i, k) * b(k, j), in double.
template <typename A, typename B>
std::vector<double> product(int64_t rows, int64_t cols, int64_t inner, A a, B b) {
  std::vector<double> c(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < inner; ++k) sum += static_cast<double>(a(i, k)) * b(k, j);
      c[static_cast<size_t>(i * cols + j)] = sum;
    }
  }
  return c;
}

struct Expected {
  std::vector<float> y, dx, da, db;
};

// The update's forward and backward from its definition; `bf16` rounds the operands of each
// product and u and du (each rounding passes its gradient unchanged).
Expected expected_update(const std::vector<float>& y0, const std::vector<float>& x,
                         const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<float>& dy, const std::vector<float>& dx0, bool bf16) {
  const auto at = [](const std::vector<float>& v, int64_t i, int64_t cols, int64_t j) {
    return v[static_cast<size_t>(i * cols + j)];
  };
  // u (N, rank) = scaling * x A^T, rounded in bf16
  std::vector<double> u = product(
      kRows, kRank, kIn, [&](int64_t i, int64_t k) { return operand(at(x, i, kIn, k), bf16); },
      [&](int64_t k, int64_t r) { return operand(at(a, r, kIn, k), bf16); });
  std::vector<float> u_op(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    u_op[i] = operand(static_cast<float>(kScaling * static_cast<float>(u[i])), bf16);
  }
  Expected e;
  const std::vector<double> update = product(
      kRows, kOut, kRank, [&](int64_t i, int64_t r) { return at(u_op, i, kRank, r); },
      [&](int64_t r, int64_t o) { return operand(at(b, o, kRank, r), bf16); });
  e.y.resize(y0.size());
  for (size_t i = 0; i < y0.size(); ++i) e.y[i] = static_cast<float>(y0[i] + update[i]);
  // du (N, rank) = scaling * dy B, rounded in bf16; dB = dy^T u
  const std::vector<double> dyb = product(
      kRows, kRank, kOut, [&](int64_t i, int64_t o) { return operand(at(dy, i, kOut, o), bf16); },
      [&](int64_t o, int64_t r) { return operand(at(b, o, kRank, r), bf16); });
  std::vector<float> du_op(dyb.size());
  for (size_t i = 0; i < dyb.size(); ++i) {
    du_op[i] = operand(kScaling * static_cast<float>(dyb[i]), bf16);
  }
  const std::vector<double> db = product(
      kOut, kRank, kRows, [&](int64_t o, int64_t i) { return operand(at(dy, i, kOut, o), bf16); },
      [&](int64_t i, int64_t r) { return at(u_op, i, kRank, r); });
  const std::vector<double> dx = product(
      kRows, kIn, kRank, [&](int64_t i, int64_t r) { return at(du_op, i, kRank, r); },
      [&](int64_t r, int64_t k) { return operand(at(a, r, kIn, k), bf16); });
  const std::vector<double> da = product(
      kRank, kIn, kRows, [&](int64_t r, int64_t i) { return at(du_op, i, kRank, r); },
      [&](int64_t i, int64_t k) { return operand(at(x, i, kIn, k), bf16); });
  e.dx.resize(dx0.size());
  for (size_t i = 0; i < dx0.size(); ++i) e.dx[i] = static_cast<float>(dx0[i] + dx[i]);
  e.da.assign(da.begin(), da.end());
  e.db.assign(db.begin(), db.end());
  return e;
}

class LoraUpdate : public ::testing::TestWithParam<bool> {};

TEST_P(LoraUpdate, EqualsItsDefinition) {
  const bool bf16 = GetParam();
  const auto& kernel = default_kernel_impl<LinearKernel>(OpKind::linear, DeviceKind::cpu);
  const std::vector<float> x = random_values(kRows * kIn, 1), a = random_values(kRank * kIn, 2),
                           b = random_values(kOut * kRank, 3), dy = random_values(kRows * kOut, 4),
                           y0 = random_values(kRows * kOut, 5), dx0 = random_values(kRows * kIn, 6);
  std::vector<float> y = y0, dx = dx0;
  std::vector<float> da(a.size(), 0.0f), db(b.size(), 0.0f);
  LoraScratch scratch;
  LoraLinear lora{"layer.q_proj", kRank,    kIn,       kOut,      kScaling,
                  a.data(),       b.data(), da.data(), db.data(), &scratch};
  if (bf16) {
    const std::vector<uint16_t> x_bits = rounded_bits(x), dy_bits = rounded_bits(dy);
    lora.forward_add_bf16(y.data(), x_bits.data(), kRows, kernel);
    lora.backward_bf16(dx.data(), dy_bits.data(), x_bits.data(), kRows, kernel);
  } else {
    lora.forward_add(y.data(), x.data(), kRows, kernel);
    lora.backward(dx.data(), dy.data(), x.data(), kRows, kernel);
  }
  const Expected want = expected_update(y0, x, a, b, dy, dx0, bf16);
  // fp32 summation order only: bf16 products are exact in fp32. On these inputs no rounding of u
  // or du lies close enough to a bf16 midpoint for that order to flip it.
  const double tol = 1e-5;
  testing::expect_close("y", y.data(), want.y.data(), kRows * kOut, tol);
  testing::expect_close("dx", dx.data(), want.dx.data(), kRows * kIn, tol);
  testing::expect_close("dA", da.data(), want.da.data(), kRank * kIn, tol);
  testing::expect_close("dB", db.data(), want.db.data(), kOut * kRank, tol);
  if (bf16) {
    // The roundings are what the bf16 case checks: without them every result moves by far more
    // than the tolerance.
    const Expected unrounded = expected_update(y0, x, a, b, dy, dx0, false);
    EXPECT_GT(testing::compare_arrays(unrounded.da.data(), want.da.data(), kRank * kIn).rel(),
              100 * tol);
    EXPECT_GT(testing::compare_arrays(unrounded.y.data(), want.y.data(), kRows * kOut).max_abs,
              100 * tol);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoraUpdate, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "bf16" : "fp32";
                         });

}  // namespace
}  // namespace titan
