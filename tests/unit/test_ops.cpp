// Every CPU kernel against its plain reference (forward and backward) and against central finite
// differences, at sizes that are not multiples of any vector width; the vector primitives under
// every ISA this CPU can run.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "compare.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/threads.h"
#include "titan/backend/cpu/vec.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/device_ops.h"
#include "titan/dispatch/registry.h"
#include "titan/nn/layers.h"
#include "titan/ops/adamw.h"
#include "titan/ops/attention.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/embedding.h"
#include "titan/ops/gemv.h"
#include "titan/ops/linear.h"
#include "titan/ops/moe.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/rope.h"
#include "titan/ops/swiglu.h"

namespace titan {
namespace {

using testing::expect_close;

std::vector<float> randn(int64_t n, uint64_t seed, float std = 1.0f) {
  std::vector<float> v(n);
  Rng(seed).fill_normal(v.data(), n, 0.0f, std);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks d/dx of L(x) = <w, f(x)> from `analytic` against central differences at `n_probe`
// coordinates. f is evaluated in fp32, so the step is large (1e-2) and the tolerance loose
// (relative 2e-2 of the gradient's scale): finite differences catch wrong formulas, the reference
// comparisons catch rounding-level differences.
void expect_finite_difference(const char* what, std::vector<float>& x,
                              const std::function<double()>& loss,
                              const std::vector<float>& analytic, int n_probe = 12) {
  double scale = 1e-6;
  for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  Rng pick(99);
  for (int p = 0; p < n_probe; ++p) {
    const size_t i = pick.next_u64() % x.size();
    const float saved = x[i];
    const float h = 1e-2f * std::max(1.0f, std::fabs(saved));
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-2 * scale) << what << " coordinate " << i;
  }
}

TEST(Vec, EveryIsaMatchesDoublePrecision) {
  const std::vector<Isa> isas = supported_isas();
  for (Isa isa : isas) {
    const VecKernels& v = vec_kernels(isa);
    EXPECT_STREQ(v.variant, isa_name(isa));
    for (int64_t n : {1, 7, 16, 17, 33, 67, 1000}) {
      std::vector<float> x = randn(n, n, 3.0f), w = randn(n, n + 1), y(n), z(n);
      double max = -1e30, sum_sq = 0, d = 0, sum_exp = 0;
      for (int64_t i = 0; i < n; ++i) {
        max = std::max(max, static_cast<double>(x[i]));
        sum_sq += static_cast<double>(x[i]) * x[i];
        d += static_cast<double>(x[i]) * w[i];
      }
      for (int64_t i = 0; i < n; ++i) sum_exp += std::exp(x[i] - max);
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      EXPECT_EQ(v.max(x.data(), n), static_cast<float>(max));
      EXPECT_NEAR(v.sum_squares(x.data(), n), sum_sq, 1e-5 * sum_sq);
      EXPECT_NEAR(v.dot(x.data(), w.data(), n), d, 1e-5 * std::sqrt(sum_sq * dot(w, w)));
      const float s = v.exp_shift_sum(y.data(), x.data(), n, static_cast<float>(max));
      EXPECT_NEAR(s, sum_exp, 2e-6 * sum_exp);
      for (int64_t i = 0; i < n; ++i) {
        // The kernel's argument is the fp32 difference; exp of it is within about 1 ulp.
        const double want_exp = std::exp(static_cast<double>(x[i] - static_cast<float>(max)));
        EXPECT_NEAR(y[i], want_exp, 2.5e-7 * want_exp);
      }
      // The bf16 forms over x's roundings: the max exactly, exp as fp32's, from the widened values.
      std::vector<uint16_t> x_bf16(n);
      double max_bf16 = -1e30, sum_exp_bf16 = 0;
      for (int64_t i = 0; i < n; ++i) {
        x_bf16[i] = f32_to_bf16(x[i]);
        max_bf16 = std::max(max_bf16, static_cast<double>(bf16_to_f32(x_bf16[i])));
      }
      for (int64_t i = 0; i < n; ++i) sum_exp_bf16 += std::exp(bf16_to_f32(x_bf16[i]) - max_bf16);
      EXPECT_EQ(v.max_bf16(x_bf16.data(), n), static_cast<float>(max_bf16));
      const float s_bf16 =
          v.exp_shift_sum_bf16(y.data(), x_bf16.data(), n, static_cast<float>(max_bf16));
      EXPECT_NEAR(s_bf16, sum_exp_bf16, 2e-6 * sum_exp_bf16);
      for (int64_t i = 0; i < n; ++i) {
        const double want_exp =
            std::exp(static_cast<double>(bf16_to_f32(x_bf16[i]) - static_cast<float>(max_bf16)));
        EXPECT_NEAR(y[i], want_exp, 2.5e-7 * want_exp);
      }
      v.silu_mul(z.data(), x.data(), w.data(), n);
      std::vector<float> want(n);
      swiglu_forward_reference(want.data(), x.data(), w.data(), n);
      expect_close(std::string(isa_name(isa)) + " silu_mul", z.data(), want.data(), n, 1e-6);
    }
    // exp at the ends of the float range: 0 below, inf above, never NaN.
    float extremes[] = {-1000.0f, -88.0f, 0.0f, 88.0f, 1000.0f}, out[5];
    v.exp_shift_sum(out, extremes, 5, 0.0f);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[2], 1.0f);
    EXPECT_TRUE(std::isinf(out[4]));
    EXPECT_NEAR(out[3], std::exp(88.0), 1e-6 * std::exp(88.0));
  }
}

// round_to_bf16 and widen_bf16 under every ISA, bit for bit: hand-worked IEEE cases (ties to
// even, carries into the exponent, overflow to inf, NaN quieted, subnormals kept -- the hardware's
// vcvtneps2bf16 would flush them), then random values against f32_to_bf16 at lengths around
// every vector width, with a scale and without.
TEST(Vec, Bf16RoundingAndWideningEveryIsaAreExact) {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: halfway, 1.0's last bit is even -> down
      {0x3f818000u, 0x3f82},  // 1 + 3 * 2^-8: halfway, odd -> up
      {0x3f808001u, 0x3f81},  // just above halfway -> up
      {0x3fffffffu, 0x4000},  // the carry reaches the exponent: 2 - ulp -> 2
      {0x7f7fffffu, 0x7f80},  // FLT_MAX rounds to +inf
      {0xff800000u, 0xff80},  // -inf
      {0x7f800001u, 0x7fc0},  // a signalling NaN whose payload is below bf16's bits: quiet NaN
      {0xffc12345u, 0xffc1},  // a quiet NaN keeps its sign and top payload bits
      {0x00000001u, 0x0000},  // the smallest subnormal rounds to zero
      {0x00018000u, 0x0002},  // a subnormal halfway between 1 and 2 bf16 ulps -> even (2)
      {0x80400000u, 0x8040},  // a negative subnormal, exact
      {0x80000000u, 0x8000},  // -0
  };
  for (Isa isa : supported_isas()) {
    const VecKernels& v = vec_kernels(isa);
    SCOPED_TRACE(isa_name(isa));
    for (const auto& [bits, want] : cases) {
      const float x = std::bit_cast<float>(bits);
      uint16_t got = 0;
      v.round_to_bf16(&got, &x, 1.0f, 1);
      EXPECT_EQ(got, want) << std::hex << "input 0x" << bits;
      float back = 0.0f;
      v.widen_bf16(&back, &want, 1);
      EXPECT_EQ(std::bit_cast<uint32_t>(back), static_cast<uint32_t>(want) << 16);
    }
    for (int64_t n : {1, 15, 16, 17, 31, 33, 64, 1000}) {
      std::vector<float> x = randn(n, 7 * n, 100.0f);
      for (float scale : {1.0f, 0.37f}) {
        std::vector<uint16_t> got(n + 1, 0xabcd);
        v.round_to_bf16(got.data(), x.data(), scale, n);
        std::vector<float> widened(n + 1, -1.0f);
        v.widen_bf16(widened.data(), got.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(got[i], f32_to_bf16(x[i] * scale)) << "n " << n << " i " << i;
          ASSERT_EQ(widened[i], bf16_to_f32(got[i])) << "n " << n << " i " << i;
        }
        EXPECT_EQ(got[n], 0xabcd) << "wrote past n " << n;
        EXPECT_EQ(widened[n], -1.0f) << "wrote past n " << n;
      }
    }
  }
}

// Rows of W x against the fp64 reference within the fp32 summation bound: a sum of `cols`
// products in fp32, in any order and with fused multiply-adds, is within cols * 2^-24 * sum|w x|
// of the exact sum (one more ulp for the final store).
void expect_gemv_close(const std::string& what, const float* got, const float* want,
                       const std::vector<float>& w, const std::vector<float>& x, int64_t rows,
                       int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    double abs_sum = 0.0;
    for (int64_t c = 0; c < cols; ++c)
      abs_sum += std::fabs(static_cast<double>(w[r * cols + c]) * x[c]);
    EXPECT_NEAR(got[r], want[r], (cols + 1) * 0x1p-24 * abs_sum) << what << " row " << r;
  }
}

// Every ISA's gemv_f32, gemv_bf16, axpy_rows and axpy_bf16 at odd row and column counts.
TEST(Vec, GemvEveryIsaMatchesReference) {
  const std::vector<Isa> isas = supported_isas();
  // Column counts around gemv_bf16's blocks of 32 and steps of 64.
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},  {3, 7},  {4, 16},  {5, 17},   {13, 33},
                                               {9, 67}, {2, 96}, {3, 100}, {8, 1000}, {7, 1001}};
  for (Isa isa : isas) {
    const VecKernels& v = vec_kernels(isa);
    for (const auto& [rows, cols] : sizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + std::to_string(rows) + "x" +
                   std::to_string(cols));
      std::vector<float> w = randn(rows * cols, rows * 100 + cols), x = randn(cols, cols);
      std::vector<uint16_t> w_bf16(w.size());
      std::vector<float> w_rounded(w.size());  // the bf16 weights' exact values
      for (size_t i = 0; i < w.size(); ++i) {
        w_bf16[i] = f32_to_bf16(w[i]);
        w_rounded[i] = bf16_to_f32(w_bf16[i]);
      }
      std::vector<float> got(rows), want(rows);
      v.gemv_f32(got.data(), w.data(), cols, x.data(), rows, cols);
      const GemvProduct f32_product{{DType::f32, w.data(), rows, cols}, want.data()};
      gemv_forward_reference({&f32_product, 1}, x.data());
      expect_gemv_close("gemv_f32", got.data(), want.data(), w, x, rows, cols);
      // The kernel takes x holding bf16 values, as gemv_forward gives it.
      std::vector<float> x_rounded(cols), x_split(cols);
      for (int64_t c = 0; c < cols; ++c) x_rounded[c] = round_to_bf16(x[c]);
      gemv_bf16_split_x(x_split.data(), x_rounded.data(), cols);
      v.gemv_bf16(got.data(), w_bf16.data(), cols, x_split.data(), rows, cols);
      const GemvProduct bf16_product{{DType::bf16, w_bf16.data(), rows, cols}, want.data()};
      gemv_forward_reference({&bf16_product, 1}, x.data());
      expect_gemv_close("gemv_bf16", got.data(), want.data(), w_rounded, x_rounded, rows, cols);
      // Rows ldw = cols + 3 apart (keys in a KV cache row): the first cols of each row only.
      const int64_t ldw = cols + 3;
      std::vector<float> w_strided(rows * ldw, NAN);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(w.begin() + r * cols, w.begin() + (r + 1) * cols, w_strided.begin() + r * ldw);
      }
      v.gemv_f32(got.data(), w_strided.data(), ldw, x.data(), rows, cols);
      gemv_forward_reference({&f32_product, 1}, x.data());
      expect_gemv_close("gemv_f32 strided", got.data(), want.data(), w, x, rows, cols);
      // axpy_rows over the same strided rows (attention weighting values): y += sum_r a[r] row_r,
      // each column within the fp32 bound of its rows + 1 terms.
      const std::vector<float> a = randn(rows, rows + 7), y0 = randn(cols, 3);
      std::vector<float> y = y0;
      v.axpy_rows(y.data(), a.data(), w_strided.data(), ldw, rows, cols);
      for (int64_t c = 0; c < cols; ++c) {
        double sum = y0[c], abs_sum = std::fabs(y0[c]);
        for (int64_t r = 0; r < rows; ++r) {
          sum += static_cast<double>(a[r]) * w[r * cols + c];
          abs_sum += std::fabs(static_cast<double>(a[r]) * w[r * cols + c]);
        }
        EXPECT_NEAR(y[c], sum, (rows + 2) * 0x1p-24 * abs_sum) << "axpy_rows column " << c;
      }
      // axpy_bf16 into y in the split layout: each column y0[c] + a * widened x[c], with at most
      // two fp32 roundings (product and sum; one when fused). Unsplitting restores the order.
      std::vector<float> y_split(cols), y_back(cols);
      gemv_bf16_split_x(y_split.data(), y0.data(), cols);
      v.axpy_bf16(y_split.data(), a[0], w_bf16.data(), cols);
      gemv_bf16_unsplit_x(y_back.data(), y_split.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const double want_c = y0[c] + static_cast<double>(a[0]) * w_rounded[c];
        const double bound = 0x1p-23 * (std::fabs(y0[c]) + std::fabs(a[0] * w_rounded[c]));
        EXPECT_NEAR(y_back[c], want_c, bound) << "axpy_bf16 column " << c;
      }
    }
  }
}

// Every ISA's one-query attention kernels (gqa_scores_*, gqa_values_*) against fp64 sums, within
// the fp32 summation bound of each: groups that run as 4 + 2 + 1, 4 + 4, 2 + 1 and 1 query heads
// per kv head; head dims with whole blocks of 32, a lone 16 and scalar tails; cache rows padded
// with NaN past their heads (a read past a head's slice would show).
TEST(Vec, GqaAttentionKernelsEveryIsaMatchReference) {
  const std::vector<Isa> isas = supported_isas();
  struct Case {
    GqaHeads heads;
    int64_t rows;
  };
  const Case cases[] = {{{1, 1, 5}, 1},  {{2, 3, 16}, 7}, {{8, 2, 128}, 19},
                        {{2, 8, 70}, 4}, {{3, 5, 48}, 9}, {{1, 7, 33}, 3}};
  for (Isa isa : isas) {
    const VecKernels& v = vec_kernels(isa);
    for (const auto& [heads, rows] : cases) {
      const int64_t hd = heads.head_dim, H = heads.kv_heads * heads.group;
      const int64_t ld = heads.kv_heads * hd + 3, lds = rows + 2;
      SCOPED_TRACE(std::string(isa_name(isa)) + " kv heads " + std::to_string(heads.kv_heads) +
                   " group " + std::to_string(heads.group) + " hd " + std::to_string(hd) +
                   " rows " + std::to_string(rows));
      const std::vector<float> q = randn(H * hd, hd), p = randn(H * lds, rows + 1),
                               out0 = randn(H * hd, 7);
      std::vector<float> kv = randn(rows * ld, ld);
      std::vector<uint16_t> kv16(kv.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = heads.kv_heads * hd; c < ld; ++c) kv[r * ld + c] = NAN;
      }
      for (size_t i = 0; i < kv.size(); ++i) kv16[i] = f32_to_bf16(kv[i]);
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(bf16 ? "bf16" : "fp32");
        // The kernels' inputs as fp32 values: bf16 rows widened exactly.
        const auto at = [&](int64_t r, int64_t h, int64_t c) -> double {
          const int64_t i = r * ld + h / heads.group * hd + c;
          return bf16 ? bf16_to_f32(kv16[i]) : kv[i];
        };
        std::vector<float> q_in(q), scores(H * lds, -1.0f), out(out0), got(H * hd);
        if (bf16) {
          for (int64_t h = 0; h < H; ++h) gemv_bf16_split_x(&q_in[h * hd], &q[h * hd], hd);
          for (int64_t h = 0; h < H; ++h) gemv_bf16_split_x(&out[h * hd], &out0[h * hd], hd);
          v.gqa_scores_bf16(scores.data(), lds, q_in.data(), kv16.data(), ld, rows, heads);
          v.gqa_values_bf16(out.data(), p.data(), lds, kv16.data(), ld, rows, heads);
          for (int64_t h = 0; h < H; ++h) gemv_bf16_unsplit_x(&got[h * hd], &out[h * hd], hd);
        } else {
          v.gqa_scores_f32(scores.data(), lds, q.data(), kv.data(), ld, rows, heads);
          v.gqa_values_f32(out.data(), p.data(), lds, kv.data(), ld, rows, heads);
          got = out;
        }
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t r = 0; r < rows; ++r) {
            double sum = 0.0, abs_sum = 0.0;
            for (int64_t c = 0; c < hd; ++c) {
              sum += q[h * hd + c] * at(r, h, c);
              abs_sum += std::fabs(q[h * hd + c] * at(r, h, c));
            }
            EXPECT_NEAR(scores[h * lds + r], sum, (hd + 1) * 0x1p-24 * abs_sum)
                << "score of head " << h << " row " << r;
          }
          for (int64_t r = rows; r < lds; ++r) EXPECT_EQ(scores[h * lds + r], -1.0f);
          for (int64_t c = 0; c < hd; ++c) {
            double sum = out0[h * hd + c], abs_sum = std::fabs(out0[h * hd + c]);
            for (int64_t r = 0; r < rows; ++r) {
              sum += p[h * lds + r] * at(r, h, c);
              abs_sum += std::fabs(p[h * lds + r] * at(r, h, c));
            }
            EXPECT_NEAR(got[h * hd + c], sum, (rows + 2) * 0x1p-24 * abs_sum)
                << "output of head " << h << " column " << c;
          }
        }
      }
    }
  }
}

// Several products of mixed dtypes in one call, spanning several row blocks (which shrink toward
// the call's end) with a ragged last one, or inside a single block: every row computed once, by
// the right weights, the bf16 ones on x rounded to bf16 and the fp32 one on x itself.
TEST(Gemv, FusedProductsMatchReference) {
  const int64_t cols = 1000;
  const int64_t rows[] = {101, 33, 7, 300};
  const DType dtypes[] = {DType::bf16, DType::f32, DType::bf16, DType::bf16};
  constexpr size_t kProducts = std::size(rows);
  std::vector<std::vector<float>> w_f32(kProducts), got(kProducts), want(kProducts);
  std::vector<std::vector<uint16_t>> w_bf16(kProducts);
  std::vector<GemvProduct> products;
  const std::vector<float> x = randn(cols, 5);
  std::vector<float> x_rounded(x);
  for (float& f : x_rounded) f = round_to_bf16(f);
  for (size_t i = 0; i < kProducts; ++i) {
    w_f32[i] = randn(rows[i] * cols, 40 + i);
    if (dtypes[i] == DType::bf16) {
      for (float& f : w_f32[i]) {
        w_bf16[i].push_back(f32_to_bf16(f));
        f = bf16_to_f32(w_bf16[i].back());
      }
    }
    got[i].assign(rows[i], NAN);
    want[i].assign(rows[i], NAN);
    const void* data =
        dtypes[i] == DType::bf16 ? static_cast<const void*>(w_bf16[i].data()) : w_f32[i].data();
    products.push_back({{dtypes[i], data, rows[i], cols}, got[i].data()});
  }
  gemv_forward(products, x.data());
  for (size_t i = 0; i < kProducts; ++i) {
    const bool bf16 = dtypes[i] == DType::bf16;
    const GemvProduct reference{{DType::f32, w_f32[i].data(), rows[i], cols}, want[i].data()};
    gemv_forward_reference({&reference, 1}, bf16 ? x_rounded.data() : x.data());
    expect_gemv_close("product " + std::to_string(i), got[i].data(), want[i].data(), w_f32[i],
                      bf16 ? x_rounded : x, rows[i], cols);
  }
  products[1].w.cols = cols - 1;
  EXPECT_THROW(gemv_forward(products, x.data()), Error);  // one x for every product
}

// x = 1 + 2^-10 is 1 in bf16: against bf16 weights of 1 each row sums cols ones, exactly, where
// the unrounded x would give cols * (1 + 2^-10); fp32 weights multiply x itself.
TEST(Gemv, Bf16WeightsMultiplyXRoundedToBf16) {
  const int64_t rows = 3, cols = 64;
  const std::vector<uint16_t> w_bf16(rows * cols, f32_to_bf16(1.0f));
  const std::vector<float> w_f32(rows * cols, 1.0f), x(cols, 1.0f + 0x1p-10f);
  std::vector<float> y_bf16(rows), y_f32(rows);
  const GemvProduct products[] = {{{DType::bf16, w_bf16.data(), rows, cols}, y_bf16.data()},
                                  {{DType::f32, w_f32.data(), rows, cols}, y_f32.data()}};
  for (const bool reference : {false, true}) {
    if (reference) {
      gemv_forward_reference(products, x.data());
    } else {
      gemv_forward(products, x.data());
    }
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(y_bf16[r], static_cast<float>(cols)) << "reference " << reference;
      EXPECT_EQ(y_f32[r], cols * (1.0f + 0x1p-10f)) << "reference " << reference;
    }
  }
}

TEST(Gemm, MatchesReferenceForEveryTransposition) {
  const int64_t m = 13, n = 29, k = 37;
  for (Trans ta : {Trans::no, Trans::yes}) {
    for (Trans tb : {Trans::no, Trans::yes}) {
      std::vector<float> a = randn(m * k, 1), b = randn(k * n, 2), c = randn(m * n, 3);
      std::vector<float> want = c;
      const int64_t lda = ta == Trans::no ? k : m, ldb = tb == Trans::no ? n : k;
      gemm_f32(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), n);
      gemm_f32_reference(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, want.data(), n);
      expect_close("gemm", c.data(), want.data(), m * n, 1e-6);
    }
  }
}

TEST(RmsNorm, MatchesReferenceAndFiniteDifferences) {
  const int64_t rows = 5, dim = 37;
  std::vector<float> x = randn(rows * dim, 1), w = randn(dim, 2), dout = randn(rows * dim, 3);
  std::vector<float> out(rows * dim), rstd(rows), ref_out(rows * dim), ref_rstd(rows);
  rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6f);
  rms_norm_forward_reference(ref_out.data(), ref_rstd.data(), x.data(), w.data(), rows, dim, 1e-6f);
  expect_close("rms_norm out", out.data(), ref_out.data(), out.size(), 1e-6);
  std::vector<float> dx(rows * dim), dw(dim, 0.0f), ref_dx(rows * dim), ref_dw(dim, 0.0f);
  rms_norm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows, dim);
  rms_norm_backward_reference(ref_dx.data(), ref_dw.data(), dout.data(), x.data(), w.data(),
                              ref_rstd.data(), rows, dim);
  expect_close("rms_norm dx", dx.data(), ref_dx.data(), dx.size(), 1e-5);
  expect_close("rms_norm dw", dw.data(), ref_dw.data(), dw.size(), 1e-5);
  const auto loss = [&] {
    rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6f);
    return dot(dout, out);
  };
  expect_finite_difference("rms_norm dx", x, loss, dx);
  expect_finite_difference("rms_norm dw", w, loss, dw);
}

TEST(Rope, MatchesReferenceAndBackwardIsTheTranspose) {
  RopeParams args;
  args.head_dim = 12;
  args.theta = 10000.0;
  const int64_t n = 9, heads = 3;
  const RopeCache cache = rope_cache_build(args, 64);
  std::vector<int32_t> pos = {0, 1, 2, 5, 8, 13, 21, 34, 63};
  std::vector<float> x = randn(n * heads * 12, 1), want = x, y = randn(x.size(), 2);
  std::vector<float> rx = x, ry = y;
  rope_forward(rx.data(), pos.data(), cache, n, heads);
  rope_forward_reference(want.data(), pos.data(), args, n, heads);
  expect_close("rope forward", rx.data(), want.data(), x.size(), 1e-6);
  rope_backward(ry.data(), pos.data(), cache, n, heads);
  // <R x, y> == <x, R^T y> for the rotation R.
  EXPECT_NEAR(dot(rx, y), dot(x, ry), 1e-5 * std::sqrt(dot(x, x) * dot(y, y)));
  std::vector<int32_t> bad = {64};
  EXPECT_THROW(rope_forward(rx.data(), bad.data(), cache, 1, heads), Error);
  const auto loss = [&] {
    std::vector<float> rotated = x;
    rope_forward(rotated.data(), pos.data(), cache, n, heads);
    return dot(y, rotated);
  };
  expect_finite_difference("rope dx", x, loss, ry);
}

TEST(Rope, YarnScalesTheRotation) {
  RopeParams args;
  args.head_dim = 16;
  args.theta = 1000000.0;
  args.scaling.type = "yarn";
  args.scaling.factor = 4.0;
  args.scaling.original_max_position_embeddings = 64;
  const RopeCache cache = rope_cache_build(args, 8);
  // cos^2 + sin^2 = attention_factor^2 = (0.1 ln 4 + 1)^2 at every position and frequency.
  const double factor = 0.1 * std::log(4.0) + 1.0;
  for (int64_t i = 0; i < 8 * 8; ++i) {
    const double c = cache.cos()[i], s = cache.sin()[i];
    EXPECT_NEAR(c * c + s * s, factor * factor, 1e-5);
  }
}

TEST(Rope, Llama3ScalesOnlyTheLowFrequencies) {
  RopeParams plain;
  plain.head_dim = 16;
  plain.theta = 500000.0;
  RopeParams llama3 = plain;
  llama3.scaling.type = "llama3";
  llama3.scaling.factor = 8.0;
  llama3.scaling.low_freq_factor = 1.0;
  llama3.scaling.high_freq_factor = 4.0;
  llama3.scaling.original_max_position_embeddings = 64;
  // Wavelengths 2 pi 500000^(j/8): j = 0 (6.3) below 64/4 is kept, j = 1 (32.5) between 16 and
  // 64 is blended, j >= 2 (168 and up) is divided by 8; no attention scaling.
  const RopeCache a = rope_cache_build(plain, 2), b = rope_cache_build(llama3, 2);
  const auto angle = [](const RopeCache& c, int64_t j) {
    return std::atan2(c.sin()[8 + j], c.cos()[8 + j]);  // position 1
  };
  EXPECT_EQ(angle(b, 0), angle(a, 0));
  const double smooth = (64.0 / (2 * M_PI / angle(a, 1)) - 1.0) / 3.0;
  EXPECT_NEAR(angle(b, 1), angle(a, 1) * ((1 - smooth) / 8 + smooth), 1e-6);
  EXPECT_GT(angle(b, 1), angle(a, 1) / 8);
  EXPECT_LT(angle(b, 1), angle(a, 1));
  for (int64_t j = 2; j < 8; ++j) EXPECT_NEAR(angle(b, j), angle(a, j) / 8, 1e-7 * angle(a, j));
  for (int64_t j = 0; j < 8; ++j) {
    const double c = b.cos()[8 + j], s = b.sin()[8 + j];
    EXPECT_NEAR(c * c + s * s, 1.0, 1e-6);
  }
}

// The first key query i of row b sees: its segment's start in a packed row, else 0.
int64_t segment_first(const AttentionShape& s, int64_t b, int64_t i) {
  return s.segment_start == nullptr ? 0 : s.segment_start[b * s.seq_q + i];
}

struct AttentionInputs {
  std::vector<float> q, k, v, out, lse, ref_out, ref_lse;
};

// Random q, k, v and the forward's out and lse, checked against the reference's.
AttentionInputs check_attention_forward(const AttentionShape& s) {
  const int64_t nq = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  const size_t n_lse = static_cast<size_t>(s.batch * s.n_heads * s.seq_q);
  AttentionInputs a{randn(nq, 1),
                    randn(nkv, 2),
                    randn(nkv, 3),
                    std::vector<float>(nq),
                    std::vector<float>(n_lse),
                    std::vector<float>(nq),
                    std::vector<float>(n_lse)};
  attention_forward_blockwise(a.out.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), s);
  attention_forward_reference(a.ref_out.data(), a.ref_lse.data(), a.q.data(), a.k.data(),
                              a.v.data(), s);
  expect_close("attention out", a.out.data(), a.ref_out.data(), nq, 1e-5);
  expect_close("attention lse", a.lse.data(), a.ref_lse.data(), n_lse, 1e-6);
  return a;
}

void check_attention(const AttentionShape& s) {
  const int64_t nq = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  auto [q, k, v, out, lse, ref_out, ref_lse] = check_attention_forward(s);
  const std::vector<float> dout = randn(nq, 4);
  std::vector<float> dq(nq), dk(nkv), dv(nkv), rdq(nq), rdk(nkv), rdv(nkv);
  attention_backward_blockwise(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                               v.data(), out.data(), lse.data(), s);
  attention_backward_reference(rdq.data(), rdk.data(), rdv.data(), dout.data(), q.data(), k.data(),
                               v.data(), ref_out.data(), ref_lse.data(), s);
  expect_close("attention dq", dq.data(), rdq.data(), nq, 1e-5);
  expect_close("attention dk", dk.data(), rdk.data(), nkv, 1e-5);
  expect_close("attention dv", dv.data(), rdv.data(), nkv, 1e-5);
  const auto loss = [&] {
    attention_forward_blockwise(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    return dot(dout, out);
  };
  expect_finite_difference("attention dq", q, loss, dq);
  expect_finite_difference("attention dk", k, loss, dk);
  expect_finite_difference("attention dv", v, loss, dv);
}

TEST(Attention, TrainingShapesAcrossSeveralBlocks) {
  check_attention({2, 131, 131, 4, 2, 12});
}
TEST(Attention, MultiHeadOddSizes) {
  check_attention({1, 67, 67, 3, 3, 5});
}
TEST(Attention, QueriesAtTheEndOfLongerKeys) {
  check_attention({2, 3, 70, 4, 1, 8});
}

// The one-query (decode) path: every key visible, across several key blocks and across a few.
// (A single key is no test of the backward: its dk is exactly zero.)
TEST(Attention, OneQueryAgainstManyKeys) {
  check_attention({2, 1, 300, 4, 2, 12});
  check_attention({1, 1, 3, 2, 1, 5});
  check_attention_forward({1, 1, 37, 16, 8, 128});  // Qwen3-0.6B's heads
}

// The one-query path splits the keys over the threads: with more threads than keys some ranges
// would be empty, and one key leaves one thread.
TEST(Attention, OneQueryFewerKeysThanThreads) {
  const int saved = thread_count();
  set_thread_count(5);
  check_attention({2, 1, 3, 4, 2, 8});
  check_attention_forward({2, 1, 1, 4, 2, 8});
  set_thread_count(saved);
}

// bf16 keys and values (a bf16 KV cache): the forward equals the fp32 forward -- and the
// reference -- on the same values widened, to fp32 summation order (the widening is exact), on
// the one-query path (split layouts, a head_dim with a tail after its blocks of 32, more threads
// than keys) and the blockwise one (queries at the end of longer keys, several key blocks).
void check_attention_bf16_kv(const AttentionShape& s) {
  SCOPED_TRACE("seq_q " + std::to_string(s.seq_q) + " seq_kv " + std::to_string(s.seq_kv) + " hd " +
               std::to_string(s.head_dim));
  const int64_t nq = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  const int64_t n_lse = s.batch * s.n_heads * s.seq_q;
  const std::vector<float> q = randn(nq, 1), k = randn(nkv, 2), v = randn(nkv, 3);
  std::vector<uint16_t> k16(nkv), v16(nkv);
  std::vector<float> k_wide(nkv), v_wide(nkv);
  for (int64_t i = 0; i < nkv; ++i) {
    k16[i] = f32_to_bf16(k[i]);
    v16[i] = f32_to_bf16(v[i]);
    k_wide[i] = bf16_to_f32(k16[i]);
    v_wide[i] = bf16_to_f32(v16[i]);
  }
  std::vector<float> out(nq), lse(n_lse), want(nq), want_lse(n_lse), ref(nq), ref_lse(n_lse);
  attention_forward_blockwise_bf16_kv(out.data(), lse.data(), q.data(), k16.data(), v16.data(), s);
  attention_forward_blockwise(want.data(), want_lse.data(), q.data(), k_wide.data(), v_wide.data(),
                              s);
  expect_close("bf16 kv out vs fp32 on widened", out.data(), want.data(), nq, 1e-6);
  expect_close("bf16 kv lse vs fp32 on widened", lse.data(), want_lse.data(), n_lse, 1e-6);
  attention_forward_reference(want.data(), want_lse.data(), q.data(), k_wide.data(), v_wide.data(),
                              s);
  attention_forward_reference_bf16_kv(ref.data(), ref_lse.data(), q.data(), k16.data(), v16.data(),
                                      s);
  EXPECT_EQ(ref, want);
  EXPECT_EQ(ref_lse, want_lse);
  expect_close("bf16 kv out vs reference", out.data(), ref.data(), nq, 1e-5);
  expect_close("bf16 kv lse vs reference", lse.data(), ref_lse.data(), n_lse, 1e-6);
}

TEST(Attention, Bf16KeysAndValuesEqualFp32OnWidenedValues) {
  check_attention_bf16_kv({2, 1, 300, 4, 2, 12});
  check_attention_bf16_kv({1, 1, 37, 16, 8, 128});  // Qwen3-0.6B's heads
  check_attention_bf16_kv({1, 1, 19, 4, 2, 70});    // two blocks of 32 and a tail of 6
  check_attention_bf16_kv({2, 3, 70, 4, 1, 8});
  check_attention_bf16_kv({1, 131, 140, 4, 2, 40});  // several query and key blocks
  const int saved = thread_count();
  set_thread_count(5);
  check_attention_bf16_kv({2, 1, 3, 4, 2, 40});
  set_thread_count(saved);
}

// x rounded to bf16 values (fp32), and their raw bits into `bits` unless null.
std::vector<float> bf16_valued(std::vector<float> x, std::vector<uint16_t>* bits) {
  if (bits != nullptr) bits->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t b = f32_to_bf16(x[i]);
    if (bits != nullptr) (*bits)[i] = b;
    x[i] = bf16_to_f32(b);
  }
  return x;
}

// The forward over bf16 q, k and v against the fp64 reference on the same values. The kernel
// rounds each probability (before the division by its row sum) to bf16 for P V, at most 2^-9 of
// it, so out_id may differ from the reference by 2^-9 sum_j P_ij |v_jd|; the bound allows twice
// that, plus fp32 summation noise. lse is fp32 throughout: its scores are sums of hd exact bf16
// products in fp32 (hd 2^-24 of sum_d |q_d k_d|, times the scale), then an exp and a log. The
// output must also round: beyond 2^-12 of its scale somewhere (an fp32 forward stays ~1e-6 away).
void check_attention_forward_bf16(const AttentionShape& s) {
  SCOPED_TRACE("seq_q " + std::to_string(s.seq_q) + " seq_kv " + std::to_string(s.seq_kv) + " hd " +
               std::to_string(s.head_dim));
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t nq = s.batch * s.seq_q * H * hd, nkv = s.batch * s.seq_kv * KV * hd;
  const int64_t n_lse = s.batch * H * s.seq_q, offset = s.seq_kv - s.seq_q;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<uint16_t> q16, k16, v16;
  const std::vector<float> q = bf16_valued(randn(nq, 5, 2.0f), &q16),
                           k = bf16_valued(randn(nkv, 6), &k16),
                           v = bf16_valued(randn(nkv, 7), &v16);
  std::vector<float> out(nq), lse(n_lse), want(nq), want_lse(n_lse);
  attention_forward_blockwise_bf16(out.data(), lse.data(), q16.data(), k16.data(), v16.data(), s);
  attention_forward_reference(want.data(), want_lse.data(), q.data(), k.data(), v.data(), s);
  double out_scale = 1e-30, worst_rel = 0.0;
  for (float w : want) out_scale = std::max(out_scale, std::fabs(static_cast<double>(w)));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t qrow = ((b * s.seq_q + i) * H + h) * hd, at = (b * H + h) * s.seq_q + i;
        std::vector<double> bound(hd, 0.0);
        double score_error = 0.0;
        for (int64_t j = segment_first(s, b, i); j <= offset + i; ++j) {
          const int64_t krow = ((b * s.seq_kv + j) * KV + h / G) * hd;
          double score = 0.0, score_abs = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            score += static_cast<double>(q[qrow + d]) * k[krow + d];
            score_abs += std::fabs(static_cast<double>(q[qrow + d]) * k[krow + d]);
          }
          score_error = std::max(score_error, hd * 0x1p-24 * score_abs * scale);
          const double prob = std::exp(score * scale - want_lse[at]);
          for (int64_t d = 0; d < hd; ++d) bound[d] += 0x1p-8 * prob * std::fabs(v[krow + d]);
        }
        ASSERT_LE(std::fabs(static_cast<double>(lse[at]) - want_lse[at]),
                  score_error + 1e-6 * (1.0 + std::fabs(want_lse[at])))
            << "lse of head " << h << " query " << i;
        for (int64_t d = 0; d < hd; ++d) {
          const double diff = std::fabs(static_cast<double>(out[qrow + d]) - want[qrow + d]);
          ASSERT_LE(diff, bound[d] + 1e-6 * out_scale) << "out element " << qrow + d;
          worst_rel = std::max(worst_rel, diff / out_scale);
        }
      }
    }
  }
  EXPECT_GT(worst_rel, 0x1p-12) << "no bf16 rounding shows";
}

TEST(Attention, Bf16ForwardWithinItsRoundingOfTheReference) {
  check_attention_forward_bf16({1, 131, 140, 4, 2, 40});  // several query and key blocks
  check_attention_forward_bf16({2, 67, 67, 3, 3, 16});
  check_attention_forward_bf16({2, 300, 300, 2, 1, 64});  // three blocks of each, a group of 2
  // One query (a bf16 model's decode step): the one-query path, probabilities rounded too, over
  // one key block, over five (0.6B's heads) and split across five threads.
  check_attention_forward_bf16({2, 1, 70, 4, 2, 8});
  check_attention_forward_bf16({1, 1, 600, 16, 8, 128});
  const int saved = thread_count();
  set_thread_count(5);
  check_attention_forward_bf16({2, 130, 130, 4, 2, 32});
  check_attention_forward_bf16({1, 1, 300, 4, 2, 40});
  set_thread_count(saved);
}

// The backward over bf16 q, k and v (mixed-precision training) against the fp64 reference on
// the same values, dout already bf16-valued (the kernel's rounding of it is then exact). What
// remains is the kernel's rounding of each block's probabilities P (for dv) and score gradients
// dS (for dq, dk) to bf16, at most 2^-9 of each, so an element may differ from the reference by
// 2^-9 of the sum of its terms' magnitudes: sum_i P_ij |dout_id| for dv, sum_j |dS_ij| |k_jd| for
// dq and sum_i |dS_ij| |q_id| for dk. The bound allows twice that (2^-8), and for dS, which is
// P (dP - delta) with dP and delta summed in fp32, also hd 2^-24 of those sums' magnitudes. It
// must also round: an fp32 backward stays ~1e-6 away, this one beyond 2^-12 somewhere.
void check_attention_backward_bf16(const AttentionShape& s) {
  SCOPED_TRACE("seq_q " + std::to_string(s.seq_q) + " seq_kv " + std::to_string(s.seq_kv) + " hd " +
               std::to_string(s.head_dim));
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t nq = s.batch * s.seq_q * H * hd, nkv = s.batch * s.seq_kv * KV * hd;
  const int64_t offset = s.seq_kv - s.seq_q;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<uint16_t> q16, k16, v16;
  const std::vector<float> q = bf16_valued(randn(nq, 1), &q16),
                           k = bf16_valued(randn(nkv, 2), &k16),
                           v = bf16_valued(randn(nkv, 3), &v16),
                           dout = bf16_valued(randn(nq, 4), nullptr);
  std::vector<float> exact_out(nq), lse(s.batch * H * s.seq_q);
  attention_forward_reference(exact_out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  // Training keeps the output as o_proj reads it, rounded to bf16.
  std::vector<uint16_t> out16;
  const std::vector<float> out = bf16_valued(exact_out, &out16);
  std::vector<float> dq(nq), dk(nkv), dv(nkv), rdq(nq), rdk(nkv), rdv(nkv);
  attention_backward_blockwise_bf16(dq.data(), dk.data(), dv.data(), dout.data(), q16.data(),
                                    k16.data(), v16.data(), out16.data(), lse.data(), s);
  attention_backward_reference(rdq.data(), rdk.data(), rdv.data(), dout.data(), q.data(), k.data(),
                               v.data(), out.data(), lse.data(), s);
  std::vector<double> bound_q(nq, 0.0), bound_k(nkv, 0.0), bound_v(nkv, 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t qrow = ((b * s.seq_q + i) * H + h) * hd;
        double delta = 0.0, delta_abs = 0.0;
        for (int64_t d = 0; d < hd; ++d) {
          delta += static_cast<double>(dout[qrow + d]) * out[qrow + d];
          delta_abs += std::fabs(static_cast<double>(dout[qrow + d]) * out[qrow + d]);
        }
        for (int64_t j = segment_first(s, b, i); j <= offset + i; ++j) {
          const int64_t krow = ((b * s.seq_kv + j) * KV + h / G) * hd;
          double score = 0.0, dprob = 0.0, dprob_abs = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            score += static_cast<double>(q[qrow + d]) * k[krow + d];
            dprob += static_cast<double>(dout[qrow + d]) * v[krow + d];
            dprob_abs += std::fabs(static_cast<double>(dout[qrow + d]) * v[krow + d]);
          }
          const double prob = std::exp(score * scale - lse[(b * H + h) * s.seq_q + i]);
          const double ds =
              prob * scale * (std::fabs(dprob - delta) + hd * 0x1p-24 * (dprob_abs + delta_abs));
          for (int64_t d = 0; d < hd; ++d) {
            bound_v[krow + d] += 0x1p-8 * prob * std::fabs(dout[qrow + d]);
            bound_q[qrow + d] += 0x1p-8 * ds * std::fabs(k[krow + d]);
            bound_k[krow + d] += 0x1p-8 * ds * std::fabs(q[qrow + d]);
          }
        }
      }
    }
  }
  const auto check = [](const char* what, const std::vector<float>& got,
                        const std::vector<float>& want, const std::vector<double>& bound) {
    double worst_rel = 0.0, scale_of = 1e-30;
    for (float w : want) scale_of = std::max(scale_of, std::fabs(static_cast<double>(w)));
    for (size_t i = 0; i < got.size(); ++i) {
      const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
      ASSERT_LE(diff, bound[i] + 1e-7 * scale_of) << what << " element " << i;
      worst_rel = std::max(worst_rel, diff / scale_of);
    }
    EXPECT_GT(worst_rel, 0x1p-12) << what << ": no bf16 rounding shows";
  };
  check("dq", dq, rdq, bound_q);
  check("dk", dk, rdk, bound_k);
  check("dv", dv, rdv, bound_v);
}

TEST(Attention, Bf16BackwardWithinItsRoundingOfTheReference) {
  check_attention_backward_bf16({1, 131, 140, 4, 2, 40});  // several query and key blocks
  check_attention_backward_bf16({2, 67, 67, 3, 3, 16});
  check_attention_backward_bf16({2, 260, 260, 2, 1, 64});  // three blocks of each, a group of 2
}

// Packed rows (AttentionShape::segment_start): sequences of lengths `lengths`, one after another
// in each row (the same in every row but rotated by the row's index, so rows differ), as the
// per-query start of each one's segment.
std::vector<int32_t> packed_starts(const std::vector<int64_t>& lengths, int64_t batch) {
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t at = 0;
    for (size_t n = 0; n < lengths.size(); ++n) {
      const int64_t len = lengths[(n + static_cast<size_t>(b)) % lengths.size()];
      for (int64_t i = 0; i < len; ++i) starts.push_back(static_cast<int32_t>(at));
      at += len;
    }
  }
  return starts;
}

// Segment-aware causal attention against the reference (which skips the keys before each query's
// segment), forward and backward, and the backward against finite differences: segments within a
// block, across block edges, of one token, and a row that is one segment.
TEST(Attention, PackedRowsAgainstTheReference) {
  const std::vector<int32_t> a = packed_starts({50, 80, 1, 129, 40}, 2);  // 300 per row
  check_attention({2, 300, 300, 4, 2, 12, a.data()});
  const std::vector<int32_t> b = packed_starts({3, 1, 5, 20, 38}, 1);  // 67
  check_attention({1, 67, 67, 3, 3, 5, b.data()});
  const std::vector<int32_t> c = packed_starts({131}, 2);
  check_attention({2, 131, 131, 4, 1, 8, c.data()});
}

// Packed rows compute what each sequence run alone computes: out, lse, dq, dk and dv equal the
// plain causal kernel's on each segment's q, k and v alone, stitched back together, to fp32
// summation order (the key blocks fall elsewhere). Compared whole, so that a one-token sequence
// (its dq and dk are zero but for rounding) is measured against the gradients' scale.
TEST(Attention, PackedRowsEqualEachSequenceRunAlone) {
  const std::vector<int64_t> lengths = {50, 129, 1, 70, 50};  // 300: segments cross block edges
  const int64_t B = 1, S = 300, H = 4, KV = 2, hd = 16;
  const std::vector<int32_t> starts = packed_starts(lengths, B);
  const AttentionShape packed{B, S, S, H, KV, hd, starts.data()};
  const std::vector<float> q = randn(S * H * hd, 1), k = randn(S * KV * hd, 2),
                           v = randn(S * KV * hd, 3), dout = randn(S * H * hd, 4);
  std::vector<float> out(q.size()), lse(H * S), dq(q.size()), dk(k.size()), dv(v.size());
  attention_forward_blockwise(out.data(), lse.data(), q.data(), k.data(), v.data(), packed);
  attention_backward_blockwise(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                               v.data(), out.data(), lse.data(), packed);
  std::vector<float> out_alone, lse_alone(lse.size()), dq_alone, dk_alone, dv_alone;
  int64_t at = 0;
  for (const int64_t len : lengths) {
    const AttentionShape alone{1, len, len, H, KV, hd};
    const auto rows = [&](const std::vector<float>& x, int64_t heads) {
      return std::vector<float>(x.begin() + at * heads * hd, x.begin() + (at + len) * heads * hd);
    };
    const std::vector<float> q1 = rows(q, H), k1 = rows(k, KV), v1 = rows(v, KV),
                             dout1 = rows(dout, H);
    std::vector<float> out1(q1.size()), lse1(H * len), dq1(q1.size()), dk1(k1.size()),
        dv1(v1.size());
    attention_forward_blockwise(out1.data(), lse1.data(), q1.data(), k1.data(), v1.data(), alone);
    attention_backward_blockwise(dq1.data(), dk1.data(), dv1.data(), dout1.data(), q1.data(),
                                 k1.data(), v1.data(), out1.data(), lse1.data(), alone);
    for (int64_t h = 0; h < H; ++h) {
      std::copy_n(lse1.begin() + h * len, len, lse_alone.begin() + h * S + at);
    }
    out_alone.insert(out_alone.end(), out1.begin(), out1.end());
    dq_alone.insert(dq_alone.end(), dq1.begin(), dq1.end());
    dk_alone.insert(dk_alone.end(), dk1.begin(), dk1.end());
    dv_alone.insert(dv_alone.end(), dv1.begin(), dv1.end());
    at += len;
  }
  expect_close("packed out", out.data(), out_alone.data(), S * H * hd, 1e-6);
  expect_close("packed lse", lse.data(), lse_alone.data(), H * S, 1e-6);
  expect_close("packed dq", dq.data(), dq_alone.data(), S * H * hd, 1e-6);
  expect_close("packed dk", dk.data(), dk_alone.data(), S * KV * hd, 1e-6);
  expect_close("packed dv", dv.data(), dv_alone.data(), S * KV * hd, 1e-6);
}

// A row that is one segment (every start 0) runs the plain causal kernel's operations: the same
// bits as without segments, fp32 and bf16, forward and backward.
TEST(Attention, OneSegmentPerRowIsThePlainCausalKernelBitForBit) {
  const int64_t B = 2, S = 260, H = 4, KV = 2, hd = 16;
  const std::vector<int32_t> zeros(B * S, 0);
  const AttentionShape plain{B, S, S, H, KV, hd}, one{B, S, S, H, KV, hd, zeros.data()};
  std::vector<uint16_t> q16, k16, v16, out16;
  const std::vector<float> q = bf16_valued(randn(B * S * H * hd, 1), &q16),
                           k = bf16_valued(randn(B * S * KV * hd, 2), &k16),
                           v = bf16_valued(randn(B * S * KV * hd, 3), &v16),
                           dout = randn(B * S * H * hd, 4);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    std::vector<float> out[2], lse[2], dq[2], dk[2], dv[2];
    for (int run = 0; run < 2; ++run) {
      const AttentionShape& s = run == 0 ? plain : one;
      out[run].resize(q.size()), lse[run].resize(B * H * S), dq[run].resize(q.size());
      dk[run].resize(k.size()), dv[run].resize(v.size());
      if (bf16) {
        attention_forward_blockwise_bf16(out[run].data(), lse[run].data(), q16.data(), k16.data(),
                                         v16.data(), s);
        bf16_valued(out[run], &out16);
        attention_backward_blockwise_bf16(dq[run].data(), dk[run].data(), dv[run].data(),
                                          dout.data(), q16.data(), k16.data(), v16.data(),
                                          out16.data(), lse[run].data(), s);
      } else {
        attention_forward_blockwise(out[run].data(), lse[run].data(), q.data(), k.data(), v.data(),
                                    s);
        attention_backward_blockwise(dq[run].data(), dk[run].data(), dv[run].data(), dout.data(),
                                     q.data(), k.data(), v.data(), out[run].data(), lse[run].data(),
                                     s);
      }
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(lse[0], lse[1]);
    EXPECT_EQ(dq[0], dq[1]);
    EXPECT_EQ(dk[0], dk[1]);
    EXPECT_EQ(dv[0], dv[1]);
  }
}

// bf16 packed rows within the bf16 kernels' rounding of the segment-aware reference.
TEST(Attention, Bf16PackedRowsWithinTheirRoundingOfTheReference) {
  const std::vector<int32_t> a = packed_starts({50, 80, 1, 129, 40}, 1);
  check_attention_forward_bf16({1, 300, 300, 2, 1, 64, a.data()});
  check_attention_backward_bf16({1, 300, 300, 2, 1, 64, a.data()});
}

// Segment starts that go back, or past their own query, or with fewer queries than keys, are
// refused in one line naming the row and query.
TEST(Attention, BadSegmentStartsAreRefused) {
  std::vector<int32_t> starts = packed_starts({3, 3}, 1);
  starts[4] = 0;  // goes back from 3
  const auto refused = [&](const AttentionShape& s, const std::string& part) {
    try {
      attention_check_shape(s);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused({1, 6, 6, 2, 1, 4, starts.data()}, "row 0, query 4 has segment start 0");
  starts[4] = 3, starts[1] = 2;  // past query 1
  refused({1, 6, 6, 2, 1, 4, starts.data()}, "row 0, query 1 has segment start 2");
  refused({1, 3, 6, 2, 1, 4, starts.data()}, "need as many queries as keys");
}

// The one-query path against the reference at decode depths from one key to past 512 (ranges of
// every thread count's split), for groups of 1, 2, 3 and 8 query heads per kv head, head dims
// with and without tails, over an fp32 and a bf16 cache.
TEST(Attention, OneQueryAtSeveralDepthsHeadCountsAndCacheDtypes) {
  const int64_t heads[][3] = {{16, 8, 128}, {8, 1, 64}, {6, 2, 40}, {5, 5, 70}};
  for (const auto& [n_heads, n_kv_heads, hd] : heads) {
    for (int64_t depth : {1, 2, 31, 130, 513, 600}) {
      SCOPED_TRACE("heads " + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
                   " depth " + std::to_string(depth));
      check_attention_forward({1, 1, depth, n_heads, n_kv_heads, hd});
      check_attention_bf16_kv({1, 1, depth, n_heads, n_kv_heads, hd});
    }
  }
}

TEST(Attention, RejectsBadShapes) {
  std::vector<float> buf(64);
  EXPECT_THROW(attention_forward_blockwise(buf.data(), buf.data(), buf.data(), buf.data(),
                                           buf.data(), {1, 2, 2, 3, 2, 4}),
               Error);
  EXPECT_THROW(attention_forward_blockwise(buf.data(), buf.data(), buf.data(), buf.data(),
                                           buf.data(), {1, 0, 2, 2, 2, 4}),
               Error);
  EXPECT_THROW(attention_forward_blockwise(buf.data(), buf.data(), buf.data(), buf.data(),
                                           buf.data(), {1, 3, 2, 2, 2, 4}),
               Error);
}

TEST(Swiglu, MatchesReferenceAndFiniteDifferences) {
  const int64_t n = 53;
  std::vector<float> gate = randn(n, 1, 3.0f), up = randn(n, 2), dout = randn(n, 3);
  std::vector<float> out(n), want(n), dg(n), du(n), rdg(n), rdu(n);
  swiglu_forward(out.data(), gate.data(), up.data(), n);
  swiglu_forward_reference(want.data(), gate.data(), up.data(), n);
  expect_close("swiglu out", out.data(), want.data(), n, 1e-6);
  swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
  swiglu_backward_reference(rdg.data(), rdu.data(), dout.data(), gate.data(), up.data(), n);
  expect_close("swiglu dgate", dg.data(), rdg.data(), n, 1e-6);
  expect_close("swiglu dup", du.data(), rdu.data(), n, 1e-6);
  const auto loss = [&] {
    swiglu_forward(out.data(), gate.data(), up.data(), n);
    return dot(dout, out);
  };
  expect_finite_difference("swiglu dgate", gate, loss, dg);
  expect_finite_difference("swiglu dup", up, loss, du);
}

// The mixed-precision forms on enough elements for several threads and a partial chunk: gate and
// up kept as their roundings, bit for bit; the product within one bf16 rounding (2^-8 of it, the
// fp32 silu's own error being far below) of the fp64 reference on those roundings; the
// recomputation equal to the forward's bits, with or without keeping; the backward's gradients
// the fp32 one's (tested against the reference above) on the widened values, rounded.
TEST(Swiglu, Bf16FormsKeepRoundingsAndMatchTheReference) {
  const int64_t n = 40000;
  std::vector<float> gate = randn(n, 11, 3.0f), up = randn(n, 12), dout = randn(n, 13);
  std::vector<uint16_t> act(n), gate_kept(n), up_kept(n), again(n), unkept(n);
  swiglu_forward_bf16(act.data(), gate_kept.data(), up_kept.data(), gate.data(), up.data(), n);
  std::vector<float> gate_r(n), up_r(n), want(n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(gate_kept[i], f32_to_bf16(gate[i])) << i;
    ASSERT_EQ(up_kept[i], f32_to_bf16(up[i])) << i;
    gate_r[i] = bf16_to_f32(gate_kept[i]);
    up_r[i] = bf16_to_f32(up_kept[i]);
  }
  swiglu_forward_reference(want.data(), gate_r.data(), up_r.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(bf16_to_f32(act[i]), want[i], 0x1p-8 * std::fabs(want[i])) << i;
  }
  swiglu_recompute_bf16(again.data(), gate_kept.data(), up_kept.data(), n);
  swiglu_forward_bf16(unkept.data(), nullptr, nullptr, gate.data(), up.data(), n);
  EXPECT_EQ(again, act);
  EXPECT_EQ(unkept, act);
  std::vector<uint16_t> dg(n), du(n);
  swiglu_backward_bf16(dg.data(), du.data(), dout.data(), gate_kept.data(), up_kept.data(), n);
  std::vector<float> fdg(n), fdu(n);
  swiglu_backward(fdg.data(), fdu.data(), dout.data(), gate_r.data(), up_r.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(dg[i], f32_to_bf16(fdg[i])) << i;
    ASSERT_EQ(du[i], f32_to_bf16(fdu[i])) << i;
  }
}

TEST(Linear, MatchesReferenceAndFiniteDifferences) {
  const int64_t n = 7, in = 19, out_f = 11;
  std::vector<float> x = randn(n * in, 1), w = randn(out_f * in, 2), dy = randn(n * out_f, 3);
  std::vector<float> y(n * out_f), ry(n * out_f), dx(n * in), dw(out_f * in, 0.0f), rdx(n * in),
      rdw(out_f * in, 0.0f);
  linear_forward(y.data(), x.data(), w.data(), n, in, out_f);
  linear_forward_reference(ry.data(), x.data(), w.data(), n, in, out_f);
  expect_close("linear y", y.data(), ry.data(), y.size(), 1e-6);
  linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), n, in, out_f, false);
  linear_backward_reference(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), n, in, out_f,
                            false);
  expect_close("linear dx", dx.data(), rdx.data(), dx.size(), 1e-6);
  expect_close("linear dw", dw.data(), rdw.data(), dw.size(), 1e-6);
  const auto loss = [&] {
    linear_forward(y.data(), x.data(), w.data(), n, in, out_f);
    return dot(dy, y);
  };
  expect_finite_difference("linear dx", x, loss, dx);
  expect_finite_difference("linear dw", w, loss, dw);
}

// The bf16-output forward (gate_proj's and up_proj's in bf16 training): each output the bf16
// rounding of the fp32-output forward's value, bit for bit -- training's numbers do not depend on
// which of the two ran -- and so within one rounding (2^-8 of it) plus the fp32 accumulation's
// error of the reference on the same bf16 operands. Shapes: the MLP's (threads split rows and
// columns) and a ragged one.
TEST(Linear, Bf16OutputIsTheRoundedFp32Output) {
  for (const auto& [n, in, out_f] :
       {std::tuple<int64_t, int64_t, int64_t>{256, 512, 2048}, {7, 19, 11}}) {
    SCOPED_TRACE(::testing::Message() << n << " x " << in << " -> " << out_f);
    std::vector<float> x = randn(n * in, 1), w = randn(out_f * in, 2, 0.05f);
    std::vector<uint16_t> x16(x.size()), w16(w.size()), y16(n * out_f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(x16[i] = f32_to_bf16(x[i]));
    for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(w16[i] = f32_to_bf16(w[i]));
    std::vector<float> y32(n * out_f), want(n * out_f);
    linear_forward_bf16_to_bf16(y16.data(), x16.data(), w16.data(), n, in, out_f);
    linear_forward_bf16(y32.data(), x16.data(), w16.data(), n, in, out_f);
    linear_forward_reference(want.data(), x.data(), w.data(), n, in, out_f);
    int64_t rounded_apart = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < out_f; ++c) {
        const int64_t i = r * out_f + c;
        ASSERT_EQ(y16[i], f32_to_bf16(y32[i])) << r << ", " << c;
        // An fp32 sum of `in` products errs by at most in * 2^-24 * sum |x_k w_k|.
        double magnitude = 0.0;
        for (int64_t k = 0; k < in; ++k) magnitude += std::fabs(x[r * in + k] * w[c * in + k]);
        const double got = bf16_to_f32(y16[i]);
        ASSERT_NEAR(got, want[i], 0x1p-8 * std::fabs(want[i]) + in * 0x1p-24 * magnitude)
            << r << ", " << c;
        rounded_apart += got != y32[i];
      }
    }
    EXPECT_GT(rounded_apart, 0) << "the outputs must be rounded";
  }
}

TEST(Embedding, GatherAndScatterAddWithRepeatedIds) {
  const int64_t vocab = 11, dim = 70;
  std::vector<int32_t> ids = {3, 0, 3, 10, 3};
  std::vector<float> w = randn(vocab * dim, 1), out(ids.size() * dim), dout = randn(out.size(), 2);
  embedding_forward(out.data(), ids.data(), w.data(), ids.size(), vocab, dim);
  for (size_t n = 0; n < ids.size(); ++n) {
    for (int64_t c = 0; c < dim; ++c) EXPECT_EQ(out[n * dim + c], w[ids[n] * dim + c]);
  }
  std::vector<float> dw(vocab * dim, 0.0f);
  embedding_backward(dw.data(), dout.data(), ids.data(), ids.size(), dim);
  for (int64_t c = 0; c < dim; ++c) {
    EXPECT_FLOAT_EQ(dw[3 * dim + c], dout[0 * dim + c] + dout[2 * dim + c] + dout[4 * dim + c]);
    EXPECT_EQ(dw[5 * dim + c], 0.0f);
  }
  std::vector<int32_t> bad = {11};
  EXPECT_THROW(embedding_forward(out.data(), bad.data(), w.data(), 1, vocab, dim), Error);
  // From bf16 bits: each row widened exactly.
  std::vector<uint16_t> w_bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w_bf16[i] = f32_to_bf16(w[i]);
  embedding_forward_bf16(out.data(), ids.data(), w_bf16.data(), ids.size(), vocab, dim);
  for (size_t n = 0; n < ids.size(); ++n) {
    for (int64_t c = 0; c < dim; ++c) {
      EXPECT_EQ(out[n * dim + c], bf16_to_f32(w_bf16[ids[n] * dim + c]));
    }
  }
  EXPECT_THROW(embedding_forward_bf16(out.data(), bad.data(), w_bf16.data(), 1, vocab, dim), Error);
}

// The loss over fp32 x (one row of `hidden` per target) and w (vocab rows of `hidden`), in chunks
// of `chunk_tokens`, no outputs requested yet.
CrossEntropyArgs loss_args(const std::vector<float>& x, const std::vector<float>& w,
                           const std::vector<int32_t>& targets, int64_t hidden, float grad_scale,
                           int64_t chunk_tokens) {
  CrossEntropyArgs a;
  a.x = x.data();
  a.weight = w.data();
  a.targets = targets.data();
  a.n_tokens = static_cast<int64_t>(targets.size());
  a.hidden = hidden;
  a.vocab = static_cast<int64_t>(w.size()) / hidden;
  a.grad_scale = grad_scale;
  a.chunk_tokens = chunk_tokens;
  return a;
}

TEST(CrossEntropy, ChunkedMatchesReferenceAndFiniteDifferences) {
  const int64_t n = 10, hidden = 13, vocab = 301;
  std::vector<float> x = randn(n * hidden, 1), w = randn(vocab * hidden, 2, 0.5f);
  std::vector<int32_t> targets = {5, kIgnoreIndex, 300, 0, 7, 7, kIgnoreIndex, 100, 2, 299};
  const float scale = 1.0f / 8;
  std::vector<float> dx(n * hidden), dw(vocab * hidden, 0.0f), rdx(n * hidden),
      rdw(vocab * hidden, 0.0f), logits(n * vocab), rlogits(n * vocab);
  CrossEntropyArgs a = loss_args(x, w, targets, hidden, scale, 3);  // a short last chunk
  CrossEntropyArgs r = a;
  a.dx = dx.data(), a.dweight = dw.data(), a.logits = logits.data();
  r.dx = rdx.data(), r.dweight = rdw.data(), r.logits = rlogits.data();
  const CrossEntropyResult got = lm_head_cross_entropy(a);
  const CrossEntropyResult want = lm_head_cross_entropy_reference(r);
  EXPECT_EQ(got.n_scored, 8);
  EXPECT_EQ(want.n_scored, 8);
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
  expect_close("ce logits", logits.data(), rlogits.data(), logits.size(), 1e-6);
  expect_close("ce dx", dx.data(), rdx.data(), dx.size(), 1e-5);
  expect_close("ce dweight", dw.data(), rdw.data(), dw.size(), 1e-5);
  const auto loss = [&] {
    CrossEntropyArgs f = a;
    f.dx = nullptr, f.dweight = nullptr, f.logits = nullptr;
    return lm_head_cross_entropy(f).loss_sum * scale;
  };
  expect_finite_difference("ce dx", x, loss, dx);
  expect_finite_difference("ce dweight", w, loss, dw);
  targets[0] = static_cast<int32_t>(vocab);
  EXPECT_THROW(lm_head_cross_entropy(a), Error);
}

// A frozen weight (LoRA's base) is handed to the backward as a null weight gradient: every
// kernel then computes the same dx as with one, and no weight gradient (the bf16 linear too).
TEST(FrozenWeights, NullWeightGradientGivesTheSameDx) {
  const int64_t n = 7, in = 19, out_f = 11;
  std::vector<float> x = randn(n * in, 1), w = randn(out_f * in, 2), dy = randn(n * out_f, 3);
  std::vector<float> dx(n * in), dw(out_f * in, 0.0f), frozen_dx(n * in);
  linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), n, in, out_f, false);
  linear_backward(frozen_dx.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out_f, false);
  EXPECT_EQ(dx, frozen_dx);
  linear_backward_reference(frozen_dx.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out_f,
                            false);
  expect_close("frozen linear reference dx", frozen_dx.data(), dx.data(), dx.size(), 1e-6);
  std::vector<uint16_t> x16(x.size()), w16(w.size()), dy16(dy.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
  for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_bf16(w[i]);
  for (size_t i = 0; i < dy.size(); ++i) dy16[i] = f32_to_bf16(dy[i]);
  std::vector<float> dx16(n * in), dw16(out_f * in, 0.0f), frozen_dx16(n * in);
  linear_backward_bf16(dx16.data(), dw16.data(), dy16.data(), x16.data(), w16.data(), n, in, out_f,
                       false);
  linear_backward_bf16(frozen_dx16.data(), nullptr, dy16.data(), x16.data(), w16.data(), n, in,
                       out_f, false);
  EXPECT_EQ(dx16, frozen_dx16);

  const int64_t rows = 5, dim = 37;
  std::vector<float> nx = randn(rows * dim, 4), nw = randn(dim, 5), dout = randn(rows * dim, 6);
  std::vector<float> out(rows * dim), rstd(rows), ndx(rows * dim), ndw(dim, 0.0f),
      frozen_ndx(rows * dim), ref_ndx(rows * dim);
  rms_norm_forward(out.data(), rstd.data(), nx.data(), nw.data(), rows, dim, 1e-6f);
  rms_norm_backward(ndx.data(), ndw.data(), dout.data(), nx.data(), nw.data(), rstd.data(), rows,
                    dim);
  rms_norm_backward(frozen_ndx.data(), nullptr, dout.data(), nx.data(), nw.data(), rstd.data(),
                    rows, dim);
  EXPECT_EQ(ndx, frozen_ndx);
  rms_norm_backward_reference(ref_ndx.data(), nullptr, dout.data(), nx.data(), nw.data(),
                              rstd.data(), rows, dim);
  expect_close("frozen rms_norm reference dx", ref_ndx.data(), ndx.data(), ndx.size(), 1e-5);

  const int64_t hidden = 13, vocab = 301;
  std::vector<float> hx = randn(n * hidden, 7), hw = randn(vocab * hidden, 8, 0.5f);
  std::vector<int32_t> targets = {5, kIgnoreIndex, 300, 0, 7, 7, 100};
  std::vector<float> hdx(n * hidden), hdw(vocab * hidden, 0.0f), frozen_hdx(n * hidden),
      ref_hdx(n * hidden);
  CrossEntropyArgs a = loss_args(hx, hw, targets, hidden, 0.25f, 3);
  CrossEntropyArgs frozen = a, reference = a;
  a.dx = hdx.data(), a.dweight = hdw.data();
  frozen.dx = frozen_hdx.data();
  reference.dx = ref_hdx.data();
  const CrossEntropyResult with = lm_head_cross_entropy(a);
  const CrossEntropyResult without = lm_head_cross_entropy(frozen);
  EXPECT_EQ(with.loss_sum, without.loss_sum);
  EXPECT_EQ(hdx, frozen_hdx);
  lm_head_cross_entropy_reference(reference);
  expect_close("frozen lm_head reference dx", ref_hdx.data(), hdx.data(), hdx.size(), 1e-5);
  frozen.dx = nullptr, frozen.dweight = hdw.data();
  EXPECT_THROW(lm_head_cross_entropy(frozen), Error);  // a weight gradient without dx
}

// The backward cuts the vocabulary into slices of at most 4,096 rows, a run of them per thread,
// and sums the threads' shares of d x: a vocabulary of three such slices and a few rows more
// gives every thread at least one slice and some two, with uneven ends.
TEST(CrossEntropy, BackwardOverSeveralVocabularySlicesMatchesReference) {
  const int64_t n = 6, hidden = 8, vocab = 3 * 4096 + 5;
  std::vector<float> x = randn(n * hidden, 3), w = randn(vocab * hidden, 4, 0.5f);
  std::vector<int32_t> targets = {0, 4096, kIgnoreIndex, vocab - 1, 8191, 12000};
  std::vector<float> dx(n * hidden), dw(vocab * hidden, 0.5f), rdx(n * hidden),
      rdw(vocab * hidden, 0.5f);
  CrossEntropyArgs a = loss_args(x, w, targets, hidden, 1.0f / 5, 4);
  CrossEntropyArgs r = a;
  a.dx = dx.data(), a.dweight = dw.data();
  r.dx = rdx.data(), r.dweight = rdw.data();
  const CrossEntropyResult got = lm_head_cross_entropy(a);
  const CrossEntropyResult want = lm_head_cross_entropy_reference(r);
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
  expect_close("ce sliced dx", dx.data(), rdx.data(), dx.size(), 1e-5);
  // d W starts at 0.5 everywhere: it is accumulated into, not overwritten.
  expect_close("ce sliced dweight", dw.data(), rdw.data(), dw.size(), 1e-5);
}

// Mixed precision: the logits are kept in bf16 (each one a bf16 value, as autocast's lm_head
// returns them), the loss and d loss / d logits are computed from them in fp32, and the backward's
// GEMMs take d loss / d logits rounded to bf16. The reference recomputes each step in fp64 from
// the logits titan returns; between the two sides each bf16 rounding (a logit, a d logit) may
// fall apart by one bf16 ulp, at most 2^-7 of the value, where the fp32 and fp64 values sit by a
// rounding boundary.
TEST(CrossEntropy, Bf16KeepsLogitsInBf16AndMatchesItsRoundingPoints) {
  const int64_t n = 10, hidden = 13, vocab = 301;
  std::vector<float> x = randn(n * hidden, 1), w = randn(vocab * hidden, 2, 0.5f);
  std::vector<uint16_t> x16(x.size()), w16(w.size());
  for (float& v : x) v = round_to_bf16(v);
  for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(w16[i] = f32_to_bf16(w[i]));
  const std::vector<int32_t> targets = {5, kIgnoreIndex, 300, 0, 7, 7, kIgnoreIndex, 100, 2, 299};
  const float scale = 1.0f / 8;
  // Chunks of 3 rows pad the gradient rows (bf16_gradient_ld), of 10 do not.
  for (const int64_t chunk_tokens : {3, 10}) {
    SCOPED_TRACE(chunk_tokens);
    std::vector<float> dx(n * hidden), dw(vocab * hidden, 0.0f), logits(n * vocab);
    CrossEntropyArgs a = loss_args(x, w, targets, hidden, scale, chunk_tokens);
    a.weight_bf16 = w16.data();
    a.x_bf16 = x16.data();
    a.dx = dx.data(), a.dweight = dw.data(), a.logits = logits.data();
    const CrossEntropyResult got = lm_head_cross_entropy(a);
    EXPECT_EQ(got.n_scored, 8);

    constexpr double kUlp = 1.0 / 128;  // one bf16 ulp, relative, at most
    std::vector<double> dlogits(n * vocab, 0.0);
    double loss = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      const float* row = logits.data() + t * vocab;
      for (int64_t j = 0; j < vocab; ++j) {
        ASSERT_EQ(row[j], round_to_bf16(row[j])) << "logit " << t << "," << j << " is not bf16";
        double sum = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < hidden; ++p) {
          sum += static_cast<double>(x[t * hidden + p]) * w[j * hidden + p];
          magnitude += std::fabs(static_cast<double>(x[t * hidden + p]) * w[j * hidden + p]);
        }
        ASSERT_LE(std::fabs(row[j] - sum), kUlp * std::fabs(sum) + 1e-6 * magnitude)
            << "logit " << t << "," << j;
      }
      if (targets[t] == kIgnoreIndex) continue;
      const double m = *std::max_element(row, row + vocab);
      double z = 0.0;
      for (int64_t j = 0; j < vocab; ++j) z += std::exp(row[j] - m);
      loss += m + std::log(z) - row[targets[t]];
      for (int64_t j = 0; j < vocab; ++j) {
        dlogits[t * vocab + j] = std::exp(row[j] - m) / z * scale - (j == targets[t] ? scale : 0.0);
      }
    }
    EXPECT_NEAR(got.loss_sum, loss, 1e-5 * loss);
    // Each d logit titan used is the reference's within one ulp, so a product's error is at most
    // kUlp of sum |d logit| |operand|, plus fp32 accumulation (1e-6 of the same).
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t p = 0; p < hidden; ++p) {
        double want = 0.0, bound = 0.0;
        for (int64_t j = 0; j < vocab; ++j) {
          want += dlogits[t * vocab + j] * w[j * hidden + p];
          bound += std::fabs(dlogits[t * vocab + j] * w[j * hidden + p]);
        }
        EXPECT_LE(std::fabs(dx[t * hidden + p] - want), (kUlp + 1e-6) * bound)
            << "dx " << t << "," << p;
      }
    }
    for (int64_t j = 0; j < vocab; ++j) {
      for (int64_t p = 0; p < hidden; ++p) {
        double want = 0.0, bound = 0.0;
        for (int64_t t = 0; t < n; ++t) {
          want += dlogits[t * vocab + j] * x[t * hidden + p];
          bound += std::fabs(dlogits[t * vocab + j] * x[t * hidden + p]);
        }
        EXPECT_LE(std::fabs(dw[j * hidden + p] - want), (kUlp + 1e-6) * bound)
            << "dw " << j << "," << p;
      }
    }
  }
}

// A sparse MoE block at odd sizes: N = 13 tokens, h = 19, E = 5 experts of width Im = 11. When
// `forced`, input column 0 is large and positive and the router's column 0 strongly favours
// expert 0 and disfavours expert E - 1, so one expert gets every token and one gets none (its
// softmax saturates); otherwise a mild random router keeps every probability well inside (0, 1),
// where the routing weights' gradient is large.
struct MoeCase {
  int64_t n = 13, h = 19, Im = 11, E = 5, k;
  bool norm;
  std::vector<float> x, router, gate, up, down;
  std::vector<uint16_t> gate_bf16, up_bf16, down_bf16;  // after use_bf16()
  std::vector<float> router_grad, gate_grad, up_grad, down_grad;
  // Activations and scratch of the block (owned here, viewed by act / g).
  std::vector<float> logits, probs, weight, gate_act, up_act, act_act, sx, sy, dgate, dup, dact,
      dlogits, dweight, w_rows, dweight_rows, sout;
  std::vector<int32_t> index, row_of, offsets;
  MoeActivations act;
  MoeGradScratch g;
  SparseMoeBlock block;

  MoeCase(int64_t top_k, bool norm_topk, const std::string& experts_kernel, uint64_t seed,
          bool forced = true)
      : k(top_k), norm(norm_topk) {
    x = randn(n * h, seed, 1.0f);
    router = randn(E * h, seed + 1, forced ? 1.0f : 0.3f);
    if (forced) {
      for (int64_t t = 0; t < n; ++t) x[t * h] = 3.0f + 0.1f * x[t * h];
      router[0] = 5.0f;
      router[(E - 1) * h] = -5.0f;
    }
    gate = randn(E * Im * h, seed + 2, 0.3f);
    up = randn(E * Im * h, seed + 3, 0.3f);
    down = randn(E * h * Im, seed + 4, 0.3f);
    router_grad.assign(router.size(), 0.0f);
    gate_grad.assign(gate.size(), 0.0f);
    up_grad.assign(up.size(), 0.0f);
    down_grad.assign(down.size(), 0.0f);
    const int64_t rows = n * k;
    for (auto* v : {&logits, &probs, &dlogits}) v->resize(n * E);
    for (auto* v : {&weight, &dweight, &w_rows, &dweight_rows}) v->resize(rows);
    for (auto* v : {&gate_act, &up_act, &act_act, &dgate, &dup, &dact}) v->resize(rows * Im);
    for (auto* v : {&sx, &sy, &sout}) v->resize(rows * h);
    index.resize(rows);
    row_of.resize(rows);
    offsets.resize(E + 1);
    act = {logits.data(),
           probs.data(),
           index.data(),
           weight.data(),
           {gate_act.data(), up_act.data(), act_act.data(), row_of.data(), offsets.data()},
           nullptr};
    g = {dlogits.data(),
         dweight.data(),
         {sx.data(), sy.data(), dgate.data(), dup.data(), dact.data(), w_rows.data(),
          dweight_rows.data(), sout.data()}};
    block.name = "model.layers.0.mlp";
    block.hidden = h;
    block.intermediate = Im;
    block.n_experts = E;
    block.top_k = k;
    block.norm_topk_prob = norm;
    block.gate.name = "model.layers.0.mlp.gate";
    block.gate.in_features = h;
    block.gate.out_features = E;
    block.gate.weight = router.data();
    block.gate.weight_grad = router_grad.data();
    block.gate.kernel =
        &std::get<LinearKernel>(kernel_registry().get("linear", OpKind::linear).impl);
    block.weights = {gate.data(), up.data(), down.data()};
    block.grads = {gate_grad.data(), up_grad.data(), down_grad.data()};
    block.experts =
        &std::get<ExpertsKernel>(kernel_registry().get(experts_kernel, OpKind::experts).impl);
    block.experts_kernel = experts_kernel;
    block.router =
        &std::get<RouterKernel>(kernel_registry().get("router_topk", OpKind::router).impl);
    block.dispatch = &std::get<MoeDispatchKernel>(
        kernel_registry().get("moe_dispatch", OpKind::moe_dispatch).impl);
    block.grouped = &std::get<GroupedExpertsKernel>(
        kernel_registry().get("grouped_experts", OpKind::grouped_experts).impl);
    block.combine =
        &std::get<MoeCombineKernel>(kernel_registry().get("moe_combine", OpKind::moe_combine).impl);
  }
  // The experts compute in bf16 from here on, on bf16 copies of their weights.
  void use_bf16() {
    const auto rounded = [](const std::vector<float>& w) {
      std::vector<uint16_t> out(w.size());
      for (size_t i = 0; i < w.size(); ++i) out[i] = f32_to_bf16(w[i]);
      return out;
    };
    gate_bf16 = rounded(gate);
    up_bf16 = rounded(up);
    down_bf16 = rounded(down);
    block.weights_bf16 = {gate_bf16.data(), up_bf16.data(), down_bf16.data()};
  }
  std::vector<float> forward() {
    std::vector<float> y(n * h);
    block.forward(y.data(), act, g.experts, x.data(), n);
    return y;
  }
  // dx of <dy, y> + sum over tokens and experts of dprobs[e] * probs[t, e]. act is the forward's
  // scratch, which a model's other layers overwrite: the backward must recompute it.
  std::vector<float> backward(const std::vector<float>& dy, const std::vector<float>& dprobs) {
    std::fill(act_act.begin(), act_act.end(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> dx(n * h);
    block.backward(dx.data(), g, dy.data(), act, x.data(), dprobs.data(), n);
    return dx;
  }
};

TEST(Moe, GroupedExpertsMatchReferenceWhereOneExpertGetsEveryTokenAndOneNone) {
  for (const auto& [k, norm] : {std::pair<int64_t, bool>{2, true}, {3, false}}) {
    MoeCase fast(k, norm, "experts_grouped", 11), ref(k, norm, "experts_reference", 11);
    const std::vector<float> y = fast.forward(), want = ref.forward();
    EXPECT_EQ(fast.index, ref.index);
    std::vector<int64_t> tokens_of(fast.E, 0);
    for (int32_t e : fast.index) ++tokens_of[e];
    EXPECT_EQ(tokens_of[0], fast.n) << "expert 0 must get every token";
    EXPECT_EQ(tokens_of[fast.E - 1], 0) << "the last expert must get none";
    expect_close("moe y", y.data(), want.data(), y.size(), 1e-6);
    const std::vector<float> dy = randn(fast.n * fast.h, 21), dprobs = randn(fast.E, 22);
    const std::vector<float> dx = fast.backward(dy, dprobs), want_dx = ref.backward(dy, dprobs);
    expect_close("moe dx", dx.data(), want_dx.data(), dx.size(), 1e-6);
    expect_close("moe dweight", fast.dweight.data(), ref.dweight.data(), fast.dweight.size(), 1e-6);
    expect_close("moe router grad", fast.router_grad.data(), ref.router_grad.data(),
                 fast.router_grad.size(), 1e-6);
    expect_close("moe gate_proj grad", fast.gate_grad.data(), ref.gate_grad.data(),
                 fast.gate_grad.size(), 1e-6);
    expect_close("moe up_proj grad", fast.up_grad.data(), ref.up_grad.data(), fast.up_grad.size(),
                 1e-6);
    expect_close("moe down_proj grad", fast.down_grad.data(), ref.down_grad.data(),
                 fast.down_grad.size(), 1e-6);
  }
}

// Mixed precision: both kernels round the same operands to bf16 (ops/moe.h), so they differ by
// fp32 summation order (here < 3e-7), not by bf16 rounding -- unless an fp32 intermediate (gate,
// up, d act, ...) lands on the other side of a bf16 rounding boundary, which moves one term of a
// later sum by a bf16 ulp (2^-8 relative), far beyond the tolerance; no such flip happens at these
// seeds. The fp32 kernel differs from both by bf16's rounding, also far beyond it: the comparison
// tells bf16 from fp32.
TEST(Moe, Bf16GroupedExpertsMatchBf16Reference) {
  constexpr double kTolerance = 1e-5;
  for (const auto& [k, norm, forced] :
       {std::tuple<int64_t, bool, bool>{2, true, true}, {3, false, true}, {2, true, false}}) {
    MoeCase fast(k, norm, "experts_grouped", 11, forced),
        ref(k, norm, "experts_reference", 11, forced), fp32(k, norm, "experts_grouped", 11, forced);
    fast.use_bf16();
    ref.use_bf16();
    const std::vector<float> y = fast.forward(), want = ref.forward(), y_fp32 = fp32.forward();
    ASSERT_EQ(fast.index, ref.index);
    ASSERT_EQ(fast.index, fp32.index);
    expect_close("bf16 moe y", y.data(), want.data(), y.size(), kTolerance);
    EXPECT_GT(testing::compare_arrays(y_fp32.data(), want.data(), y.size()).rel(), 10 * kTolerance);
    const std::vector<float> dy = randn(fast.n * fast.h, 21), dprobs = randn(fast.E, 22);
    const std::vector<float> dx = fast.backward(dy, dprobs), want_dx = ref.backward(dy, dprobs),
                             dx_fp32 = fp32.backward(dy, dprobs);
    expect_close("bf16 moe dx", dx.data(), want_dx.data(), dx.size(), kTolerance);
    EXPECT_GT(testing::compare_arrays(dx_fp32.data(), want_dx.data(), dx.size()).rel(),
              10 * kTolerance);
    expect_close("bf16 moe dweight", fast.dweight.data(), ref.dweight.data(), fast.dweight.size(),
                 kTolerance);
    expect_close("bf16 moe router grad", fast.router_grad.data(), ref.router_grad.data(),
                 fast.router_grad.size(), kTolerance);
    expect_close("bf16 moe gate_proj grad", fast.gate_grad.data(), ref.gate_grad.data(),
                 fast.gate_grad.size(), kTolerance);
    expect_close("bf16 moe up_proj grad", fast.up_grad.data(), ref.up_grad.data(),
                 fast.up_grad.size(), kTolerance);
    expect_close("bf16 moe down_proj grad", fast.down_grad.data(), ref.down_grad.data(),
                 fast.down_grad.size(), kTolerance);
    EXPECT_GT(
        testing::compare_arrays(fp32.down_grad.data(), ref.down_grad.data(), fp32.down_grad.size())
            .rel(),
        10 * kTolerance);
  }
}

TEST(Moe, BlockGradientsMatchFiniteDifferences) {
  for (const auto& [k, norm, forced] : {std::tuple<int64_t, bool, bool>{2, true, false},
                                        {3, false, false},
                                        {2, true, true},
                                        {3, false, true}}) {
    MoeCase c(k, norm, "experts_grouped", 31, forced);
    // The probabilities' own term small, so it cannot hide the routing weights' gradient.
    const std::vector<float> dy = randn(c.n * c.h, 41), dprobs = randn(c.E, 42, 0.1f);
    c.forward();
    const std::vector<int32_t> routing = c.index;
    const std::vector<float> dx = c.backward(dy, dprobs);
    int64_t rerouted = 0;
    const auto loss = [&] {
      const std::vector<float> y = c.forward();
      rerouted += c.index != routing;  // the loss is not differentiable across a routing change
      double probs_term = 0.0;
      for (int64_t t = 0; t < c.n; ++t) {
        for (int64_t e = 0; e < c.E; ++e) probs_term += dprobs[e] * c.probs[t * c.E + e];
      }
      return dot(dy, y) + probs_term;
    };
    expect_finite_difference("moe dx", c.x, loss, dx, 40);
    expect_finite_difference("moe router dw", c.router, loss, c.router_grad, 40);
    expect_finite_difference("moe gate_proj dw", c.gate, loss, c.gate_grad);
    expect_finite_difference("moe up_proj dw", c.up, loss, c.up_grad);
    expect_finite_difference("moe down_proj dw", c.down, loss, c.down_grad);
    EXPECT_EQ(rerouted, 0) << "a finite-difference step changed the routing: pick another seed";
  }
}

TEST(Moe, BadRoutingIsAnError) {
  MoeCase c(2, true, "experts_grouped", 11);
  c.use_bf16();
  EXPECT_THROW(router_topk_forward(c.index.data(), c.weight.data(), c.probs.data(), c.logits.data(),
                                   c.n, c.E, c.E + 1, true),
               Error);
  c.forward();
  c.index[3] = static_cast<int32_t>(c.E);
  std::vector<float> y(c.n * c.h);
  for (const char* kernel : {"experts_grouped", "experts_reference"}) {
    const ExpertsKernel& k =
        std::get<ExpertsKernel>(kernel_registry().get(kernel, OpKind::experts).impl);
    EXPECT_THROW(k.forward(y.data(), c.act.experts, c.g.experts, c.x.data(), c.index.data(),
                           c.weight.data(), c.block.weights, c.block.shape(c.n)),
                 Error)
        << kernel;
    EXPECT_THROW(k.forward_bf16(y.data(), c.act.experts, c.g.experts, c.x.data(), c.index.data(),
                                c.weight.data(), c.block.weights_bf16, c.block.shape(c.n)),
                 Error)
        << kernel << " in bf16";
  }
}

// Bitwise equality of two arrays (memcmp: -0.0 and NaN payloads count too).
template <typename T>
void expect_same_bits(const std::string& what, const std::vector<T>& got,
                      const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0)
      << what << ": the staged experts differ from the fused kernel";
}

// The block over its four stage slots (route, dispatch, grouped compute, combine: the default
// experts_staged) equals the fused experts_grouped bit for bit, forward and backward, in fp32 and
// bf16, at sizes that are no multiple of a vector width and with an expert that gets no token.
TEST(Moe, StagesEqualTheFusedKernelBitForBit) {
  for (const bool bf16 : {false, true}) {
    for (const auto& [k, norm, forced] :
         {std::tuple<int64_t, bool, bool>{2, true, true}, {3, false, true}, {2, true, false}}) {
      MoeCase fused(k, norm, "experts_grouped", 11, forced),
          staged(k, norm, "experts_staged", 11, forced);
      if (bf16) {
        fused.use_bf16();
        staged.use_bf16();
      }
      const std::string what = std::string(bf16 ? "bf16" : "fp32") + " k=" + std::to_string(k);
      expect_same_bits(what + " y", staged.forward(), fused.forward());
      ASSERT_EQ(staged.index, fused.index);
      if (forced) {
        EXPECT_EQ(std::count(staged.index.begin(), staged.index.end(), staged.E - 1), 0)
            << "the last expert must get no token";
      }
      expect_same_bits(what + " offsets", staged.offsets, fused.offsets);
      const std::vector<float> dy = randn(fused.n * fused.h, 21), dprobs = randn(fused.E, 22);
      expect_same_bits(what + " dx", staged.backward(dy, dprobs), fused.backward(dy, dprobs));
      expect_same_bits(what + " dweight", staged.dweight, fused.dweight);
      expect_same_bits(what + " router grad", staged.router_grad, fused.router_grad);
      expect_same_bits(what + " gate_proj grad", staged.gate_grad, fused.gate_grad);
      expect_same_bits(what + " up_proj grad", staged.up_grad, fused.up_grad);
      expect_same_bits(what + " down_proj grad", staged.down_grad, fused.down_grad);
    }
  }
}

// Larger odd sizes (h and Im past one 64-wide GEMM block) through the registry's two experts
// kernels themselves, two experts without a token: experts_staged == experts_grouped, bitwise.
TEST(Moe, StagedKernelEqualsGroupedKernelBitForBit) {
  ExpertsShape s;
  s.n_tokens = 29, s.hidden = 67, s.inter = 37, s.n_experts = 7, s.top_k = 2;
  const int64_t n = s.n_tokens, h = s.hidden, Im = s.inter, E = s.n_experts, R = s.rows();
  const std::vector<float> x = randn(n * h, 1), gate = randn(E * Im * h, 2, 0.2f),
                           up = randn(E * Im * h, 3, 0.2f), down = randn(E * h * Im, 4, 0.2f),
                           dy = randn(n * h, 5);
  std::vector<float> weight = randn(R, 6);
  std::vector<int32_t> index(R);
  for (int64_t t = 0; t < n; ++t) {  // experts 0..4, distinct per token; 5 and 6 get none
    index[t * 2] = static_cast<int32_t>((t * 3) % 5);
    index[t * 2 + 1] = static_cast<int32_t>((t * 3 + 1 + t % 3) % 5);
  }
  const auto bits = [](const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    std::transform(v.begin(), v.end(), out.begin(), f32_to_bf16);
    return out;
  };
  const std::vector<uint16_t> gate16 = bits(gate), up16 = bits(up), down16 = bits(down);
  struct Out {
    std::vector<float> y, dx, dweight, dw;
  };
  const auto run = [&](const char* name, bool bf16) {
    const ExpertsKernel& kernel =
        std::get<ExpertsKernel>(kernel_registry().get(name, OpKind::experts).impl);
    std::vector<float> ga(R * Im), ua(R * Im), aa(R * Im), sx(R * h * 3 / 2 + 16), sy(R * h),
        dg(R * Im), du(R * Im), da(R * Im), wr(R), dwr(R);
    std::vector<int32_t> row_of(R), offsets(E + 1);
    const ExpertsActivations act{ga.data(), ua.data(), aa.data(), row_of.data(), offsets.data()};
    const ExpertsScratch scratch{sx.data(), sy.data(), dg.data(),  du.data(),
                                 da.data(), wr.data(), dwr.data(), sx.data() + (R * h + 1) / 2};
    Out o{std::vector<float>(n * h), std::vector<float>(n * h), std::vector<float>(R),
          std::vector<float>(3 * E * Im * h, 0.0f)};
    const ExpertGrads dw{o.dw.data(), o.dw.data() + E * Im * h, o.dw.data() + 2 * E * Im * h};
    if (bf16) {
      const ExpertWeightsBf16 w{gate16.data(), up16.data(), down16.data()};
      kernel.forward_bf16(o.y.data(), act, scratch, x.data(), index.data(), weight.data(), w, s);
      kernel.backward_bf16(o.dx.data(), o.dweight.data(), dw, scratch, dy.data(), act, x.data(),
                           index.data(), weight.data(), w, s);
    } else {
      const ExpertWeights w{gate.data(), up.data(), down.data()};
      kernel.forward(o.y.data(), act, scratch, x.data(), index.data(), weight.data(), w, s);
      kernel.backward(o.dx.data(), o.dweight.data(), dw, scratch, dy.data(), act, x.data(),
                      index.data(), weight.data(), w, s);
    }
    return o;
  };
  for (const bool bf16 : {false, true}) {
    const Out fused = run("experts_grouped", bf16), staged = run("experts_staged", bf16);
    const std::string what = bf16 ? "bf16 " : "fp32 ";
    expect_same_bits(what + "y", staged.y, fused.y);
    expect_same_bits(what + "dx", staged.dx, fused.dx);
    expect_same_bits(what + "dweight", staged.dweight, fused.dweight);
    expect_same_bits(what + "dweights (gate, up, down)", staged.dw, fused.dw);
  }
}

// Each stage's fast kernel against its plain reference: the data movement exactly, the sums to
// fp32 rounding, the bf16 compute to its summation order.
TEST(Moe, EachStageMatchesItsReference) {
  for (const bool forced : {true, false}) {
    MoeCase c(2, true, "experts_staged", 11, forced);
    c.forward();
    const ExpertsShape s = c.block.shape(c.n);
    const int64_t R = s.rows(), h = c.h, Im = c.Im, E = c.E;
    // route
    std::vector<int32_t> index(R);
    std::vector<float> weight(R), probs(c.n * E), dlogits(c.n * E);
    router_topk_forward_reference(index.data(), weight.data(), probs.data(), c.logits.data(), c.n,
                                  E, 2, true);
    EXPECT_EQ(index, c.index);
    expect_close("route weight", weight.data(), c.weight.data(), R, 1e-6);
    expect_close("route probs", probs.data(), c.probs.data(), c.n * E, 1e-6);
    const std::vector<float> dweight_in = randn(R, 31), dprobs = randn(E, 32);
    std::vector<float> want_dlogits(c.n * E);
    router_topk_backward(dlogits.data(), dweight_in.data(), dprobs.data(), c.probs.data(),
                         c.index.data(), c.n, E, 2, true);
    router_topk_backward_reference(want_dlogits.data(), dweight_in.data(), dprobs.data(),
                                   c.probs.data(), c.index.data(), c.n, E, 2, true);
    expect_close("route dlogits", dlogits.data(), want_dlogits.data(), c.n * E, 1e-6);
    // dispatch
    std::vector<int32_t> row_of(R), offsets(E + 1);
    moe_dispatch_plan_reference(row_of.data(), offsets.data(), c.index.data(), s);
    EXPECT_EQ(row_of, c.row_of);
    EXPECT_EQ(offsets, c.offsets);
    std::vector<float> rows(R * h), want_rows(R * h);
    moe_dispatch_forward(rows.data(), c.x.data(), c.row_of.data(), s);
    moe_dispatch_forward_reference(want_rows.data(), c.x.data(), c.row_of.data(), s);
    expect_same_bits("dispatch rows", rows, want_rows);
    std::vector<uint16_t> rows16(R * h), want_rows16(R * h);
    moe_dispatch_forward_bf16(rows16.data(), c.x.data(), c.row_of.data(), s);
    moe_dispatch_forward_bf16_reference(want_rows16.data(), c.x.data(), c.row_of.data(), s);
    expect_same_bits("dispatch bf16 rows", rows16, want_rows16);
    const std::vector<float> dx_rows = randn(R * h, 33), dweight_rows = randn(R, 34);
    std::vector<float> dx(c.n * h), want_dx(c.n * h), dw(R), want_dw(R);
    moe_dispatch_backward(dx.data(), dw.data(), dx_rows.data(), dweight_rows.data(),
                          c.row_of.data(), s);
    moe_dispatch_backward_reference(want_dx.data(), want_dw.data(), dx_rows.data(),
                                    dweight_rows.data(), c.row_of.data(), s);
    expect_close("dispatch dx", dx.data(), want_dx.data(), c.n * h, 1e-6);
    expect_same_bits("dispatch dweight", dw, want_dw);
    // combine
    std::vector<float> y(c.n * h), want_y(c.n * h), w_rows(R), want_w_rows(R);
    moe_combine_forward(y.data(), dx_rows.data(), c.row_of.data(), c.index.data(), c.weight.data(),
                        s);
    moe_combine_forward_reference(want_y.data(), dx_rows.data(), c.row_of.data(), c.index.data(),
                                  c.weight.data(), s);
    expect_close("combine y", y.data(), want_y.data(), c.n * h, 1e-6);
    const std::vector<float> dy = randn(c.n * h, 35);
    moe_combine_backward(rows.data(), w_rows.data(), dy.data(), c.weight.data(), c.row_of.data(),
                         s);
    moe_combine_backward_reference(want_rows.data(), want_w_rows.data(), dy.data(), c.weight.data(),
                                   c.row_of.data(), s);
    expect_same_bits("combine dy rows", rows, want_rows);
    expect_same_bits("combine w rows", w_rows, want_w_rows);
    // grouped compute, fp32 then bf16: the fast kernel's outputs and gradients against the
    // reference's from the same rows (x rows gathered above, dy rows and weights from combine).
    for (const bool bf16 : {false, true}) {
      const std::string what = bf16 ? "grouped bf16 " : "grouped ";
      std::vector<float> x_rows(R * h);
      moe_dispatch_forward(x_rows.data(), c.x.data(), c.row_of.data(), s);
      const ExpertWeights w32{c.gate.data(), c.up.data(), c.down.data()};
      const auto g16 = [](const std::vector<float>& v) {
        std::vector<uint16_t> out(v.size());
        std::transform(v.begin(), v.end(), out.begin(), f32_to_bf16);
        return out;
      };
      const std::vector<uint16_t> gate16 = g16(c.gate), up16 = g16(c.up), down16 = g16(c.down);
      const ExpertWeightsBf16 w16{gate16.data(), up16.data(), down16.data()};
      struct Run {
        std::vector<float> out, dx_rows, dweight_rows, dw;
      };
      const auto run = [&](bool reference) {
        std::vector<float> ga(R * Im), ua(R * Im), aa(R * Im), dg(R * Im), du(R * Im), da(R * Im),
            so(R * h);
        const ExpertsActivations act{ga.data(), ua.data(), aa.data(), c.row_of.data(),
                                     c.offsets.data()};
        const ExpertsScratch sc{nullptr,   nullptr, dg.data(), du.data(),
                                da.data(), nullptr, nullptr,   so.data()};
        Run r{std::vector<float>(R * h), rows, std::vector<float>(R),
              std::vector<float>(3 * E * Im * h, 0.0f)};
        const ExpertGrads grads{r.dw.data(), r.dw.data() + E * Im * h,
                                r.dw.data() + 2 * E * Im * h};
        if (bf16) {
          (reference ? grouped_experts_forward_bf16_reference : grouped_experts_forward_bf16)(
              r.out.data(), act, sc, rows16.data(), c.offsets.data(), w16, s);
          (reference ? grouped_experts_backward_bf16_reference : grouped_experts_backward_bf16)(
              r.dx_rows.data(), r.dweight_rows.data(), grads, sc, w_rows.data(), act, rows16.data(),
              c.offsets.data(), w16, s);
        } else {
          (reference ? grouped_experts_forward_reference : grouped_experts_forward)(
              r.out.data(), act, sc, x_rows.data(), c.offsets.data(), w32, s);
          (reference ? grouped_experts_backward_reference : grouped_experts_backward)(
              r.dx_rows.data(), r.dweight_rows.data(), grads, sc, w_rows.data(), act, x_rows.data(),
              c.offsets.data(), w32, s);
        }
        return r;
      };
      const Run fast = run(false), want = run(true);
      // As Bf16GroupedExpertsMatchBf16Reference: the same roundings, fp32 summation order apart.
      const double tol = bf16 ? 1e-5 : 1e-6;
      expect_close(what + "out", fast.out.data(), want.out.data(), R * h, tol);
      expect_close(what + "dx rows", fast.dx_rows.data(), want.dx_rows.data(), R * h, tol);
      expect_close(what + "dweight rows", fast.dweight_rows.data(), want.dweight_rows.data(), R,
                   tol);
      expect_close(what + "dweights", fast.dw.data(), want.dw.data(), 3 * E * Im * h, tol);
    }
  }
}

TEST(Moe, LoadBalancingLossIsTheSwitchTransformerFormula) {
  // Perfectly balanced routing and uniform probabilities: aux = k.
  const int64_t E = 4, k = 2, n = 6;
  std::vector<float> probs(n * E, 0.25f);
  std::vector<int32_t> index = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  std::vector<double> counts(E, 0.0), sums(E, 0.0);
  load_balancing_accumulate(counts.data(), sums.data(), probs.data(), index.data(), n, E, k);
  EXPECT_NEAR(load_balancing_loss(counts.data(), sums.data(), E, n), 2.0, 1e-12);
  // Every token on experts 0 and 1, all probability on expert 0: aux = E * (n / n) * (n / n).
  std::vector<float> peaked(n * E, 0.0f);
  for (int64_t t = 0; t < n; ++t) peaked[t * E] = 1.0f;
  std::vector<int32_t> first(n * k);
  for (int64_t t = 0; t < n; ++t) first[t * k] = 0, first[t * k + 1] = 1;
  std::fill(counts.begin(), counts.end(), 0.0);
  std::fill(sums.begin(), sums.end(), 0.0);
  load_balancing_accumulate(counts.data(), sums.data(), peaked.data(), first.data(), n, E, k);
  EXPECT_NEAR(load_balancing_loss(counts.data(), sums.data(), E, n), 4.0, 1e-12);
  std::vector<float> d(E);
  load_balancing_grad(d.data(), counts.data(), E, n, 0.5);
  EXPECT_NEAR(d[0], 0.5 * E * n / (n * n), 1e-7);
  EXPECT_EQ(d[2], 0.0f);
}

TEST(AdamW, MatchesReferenceOverSeveralSteps) {
  const int64_t n = 1037;
  std::vector<float> p = randn(n, 1), m(n, 0.0f), v(n, 0.0f), rp = p, rm = m, rv = v;
  AdamWConfig config;
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> g = randn(n, 10 + step);
    const AdamWScalars s = adamw_scalars(config, 1e-3f, step);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, s);
    adamw_update_reference(rp.data(), g.data(), rm.data(), rv.data(), n, s);
  }
  expect_close("adamw param", p.data(), rp.data(), n, 1e-6);
  expect_close("adamw exp_avg", m.data(), rm.data(), n, 1e-6);
  expect_close("adamw exp_avg_sq", v.data(), rv.data(), n, 1e-6);
  EXPECT_THROW(adamw_scalars(config, 1e-3f, 0), Error);
}

TEST(Elementwise, MatchOneThreadLoopsBitForBit) {
  // Threaded over chunks, each element still gets one rounding: the same bits as a serial loop,
  // on a length that is not a multiple of the chunk or the vector width.
  const int64_t n = (int64_t{1} << 16) + 37;
  const std::vector<float> x = randn(n, 3);
  std::vector<float> y = randn(n, 4), expect = y;
  for (int64_t i = 0; i < n; ++i) expect[i] += x[i];
  add_into(y.data(), x.data(), n);
  EXPECT_EQ(std::memcmp(y.data(), expect.data(), n * sizeof(float)), 0);
  for (int64_t i = 0; i < n; ++i) expect[i] *= 0.37f;
  scale_in_place(y.data(), 0.37f, n);
  EXPECT_EQ(std::memcmp(y.data(), expect.data(), n * sizeof(float)), 0);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  EXPECT_NEAR(sum_squares_f64(x.data(), n), sum, 1e-12 * sum);
  std::vector<float> z = x;
  EXPECT_EQ(find_nonfinite(z.data(), n), -1);
  z[n - 5] = std::numeric_limits<float>::infinity();
  z[n - 2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(find_nonfinite(z.data(), n), n - 5);
  EXPECT_EQ(find_nonfinite(z.data(), 0), -1);
}

TEST(DeviceOps, CpuTableIsTheOps) {
  // What modules reach through device_ops() on the CPU computes what the ops compute.
  const DeviceOps& ops = device_ops();
  EXPECT_EQ(ops.device, DeviceKind::cpu);
  const int64_t n = 1001;
  const std::vector<float> x = randn(n, 5);
  std::vector<float> a = randn(n, 6), b = a;
  ops.add(a.data(), x.data(), n);
  add_into(b.data(), x.data(), n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  std::vector<float> p = randn(n, 7), m(n, 0.0f), v(n, 0.0f), rp = p, rm = m, rv = v;
  AdamWConfig config;
  ops.adamw_step(p.data(), x.data(), m.data(), v.data(), n, config, 1e-3f, 2);
  adamw_update(rp.data(), x.data(), rm.data(), rv.data(), n, adamw_scalars(config, 1e-3f, 2));
  EXPECT_EQ(std::memcmp(p.data(), rp.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v.data(), rv.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace titan
