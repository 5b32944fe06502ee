// LoRA's update (nn/lora.h) against a double-precision computation of its definition: in fp32,
// y += scaling * (x A^T) B^T and its three gradients; in bf16 (mixed precision), the same with
// the operands rounded where LoraLinear documents it -- x, A, B, u = scaling * x A^T, dy and
// du = scaling * dy B -- so the two differ by fp32 summation order only. The experts' LoRA
// (nn/lora.h ExpertLora) against PEFT's ParamWrapper formula computed in double, and the adapter's
// parameters on a MoE model named and shaped as PEFT names and shapes them.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "compare.h"
#include "tiny_models.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/registry.h"
#include "titan/models/lora.h"
#include "titan/nn/lora.h"
#include "titan/ops/lora_dropout.h"

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

// Dropout (ops/lora_dropout.h): the update reads x masked and scaled by 1 / (1 - p), and its dx
// share goes back through the same mask; the expected values are the definition above on the
// masked x, the mask drawn from the documented key (seed, module, step, row, position, feature).
class LoraDropoutUpdate : public ::testing::TestWithParam<bool> {};

TEST_P(LoraDropoutUpdate, EqualsItsDefinitionOnTheMaskedInput) {
  const bool bf16 = GetParam();
  const auto& kernel = default_kernel_impl<LinearKernel>(OpKind::linear, DeviceKind::cpu);
  const std::vector<float> x = random_values(kRows * kIn, 1), a = random_values(kRank * kIn, 2),
                           b = random_values(kOut * kRank, 3), dy = random_values(kRows * kOut, 4),
                           y0 = random_values(kRows * kOut, 5), dx0 = random_values(kRows * kIn, 6);
  constexpr double p = 0.25;
  constexpr int64_t kSeqLen = 8, kFirstRow = 5, kStep = 3;
  constexpr uint64_t kSeed = 7;
  std::vector<float> y = y0, dx = dx0;
  std::vector<float> da(a.size(), 0.0f), db(b.size(), 0.0f);
  LoraScratch scratch;
  scratch.dropout = {p, true, kSeed, kStep, kFirstRow, kSeqLen};
  LoraLinear lora{"model.layers.1.mlp.up_proj",
                  kRank,
                  kIn,
                  kOut,
                  kScaling,
                  a.data(),
                  b.data(),
                  da.data(),
                  db.data(),
                  &scratch};
  const std::vector<uint16_t> x_bits = rounded_bits(x), dy_bits = rounded_bits(dy);
  if (bf16) {
    lora.forward_add_bf16(y.data(), x_bits.data(), kRows, kernel);
    lora.backward_bf16(dx.data(), dy_bits.data(), x_bits.data(), kRows, kernel);
  } else {
    lora.forward_add(y.data(), x.data(), kRows, kernel);
    lora.backward(dx.data(), dy.data(), x.data(), kRows, kernel);
  }
  const LoraDropoutCall call{p,
                             mix64(mix64(kSeed ^ fnv1a_hash("model.layers.1.mlp.up_proj")) ^ kStep),
                             kFirstRow, kSeqLen};
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  std::vector<float> keep(x.size()), x_masked(x.size());
  for (int64_t t = 0; t < kRows; ++t) {
    for (int64_t f = 0; f < kIn; ++f) {
      const auto at = static_cast<size_t>(t * kIn + f);
      keep[at] = lora_dropout_keeps(call, kFirstRow + t / kSeqLen, t % kSeqLen, f) ? scale : 0.0f;
      // bf16: the rounded input masked (rounded again by expected_update's operands).
      x_masked[at] = (bf16 ? bf16_to_f32(x_bits[at]) : x[at]) * keep[at];
    }
  }
  const std::vector<float> zeros(dx0.size(), 0.0f);
  Expected want = expected_update(y0, x_masked, a, b, dy, zeros, bf16);
  for (size_t i = 0; i < dx0.size(); ++i) want.dx[i] = dx0[i] + keep[i] * want.dx[i];
  const double tol = 1e-5;
  testing::expect_close("y", y.data(), want.y.data(), kRows * kOut, tol);
  testing::expect_close("dx", dx.data(), want.dx.data(), kRows * kIn, tol);
  testing::expect_close("dA", da.data(), want.da.data(), kRank * kIn, tol);
  testing::expect_close("dB", db.data(), want.db.data(), kOut * kRank, tol);
  // The mask is what the check sees: without it every result moves by far more.
  const Expected plain = expected_update(y0, x, a, b, dy, dx0, bf16);
  EXPECT_GT(testing::compare_arrays(plain.dx.data(), want.dx.data(), kRows * kIn).max_abs,
            100 * tol);
  EXPECT_GT(testing::compare_arrays(plain.da.data(), want.da.data(), kRank * kIn).rel(), 100 * tol);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoraDropoutUpdate, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "bf16" : "fp32";
                         });

// The masks keep a fraction near 1 - p (a fixed key: the count is deterministic), scale the kept
// values by 1 / (1 - p), and depend on a token's global row, not on how the rows are split into
// calls (micro-batches, ranks); another step or module draws another mask.
TEST(LoraDropoutMask, KeepsOneMinusPAndIgnoresTheSplit) {
  constexpr int64_t kSeqLen = 16, kRowsPerCall = 32, kFeatures = 64;
  constexpr int64_t n = 2 * kRowsPerCall * kSeqLen;
  for (const double p : {0.05, 0.25, 0.5}) {
    const std::vector<float> ones(static_cast<size_t>(n * kFeatures), 1.0f);
    const LoraDropoutCall whole{p, 123, 0, kSeqLen};
    std::vector<float> once(ones.size()), split(ones.size());
    lora_dropout_apply(once.data(), ones.data(), n, kFeatures, whole, false);
    // The same rows in two calls: rows [0, 32) and [32, 64).
    const int64_t half = n / 2;
    lora_dropout_apply(split.data(), ones.data(), half, kFeatures, whole, false);
    lora_dropout_apply(split.data() + half * kFeatures, ones.data(), half, kFeatures,
                       {p, 123, kRowsPerCall, kSeqLen}, false);
    EXPECT_EQ(once, split) << "p " << p;
    int64_t kept = 0;
    const auto scale = static_cast<float>(1.0 / (1.0 - p));
    for (float v : once) {
      ASSERT_TRUE(v == 0.0f || v == scale) << v;
      kept += v != 0.0f;
    }
    const double fraction = static_cast<double>(kept) / static_cast<double>(once.size());
    // 65536 draws: the binomial's standard deviation is at most 0.002.
    EXPECT_NEAR(fraction, 1.0 - p, 0.01) << "p " << p;
    std::vector<float> other(ones.size());
    lora_dropout_apply(other.data(), ones.data(), n, kFeatures, {p, 124, 0, kSeqLen}, false);
    EXPECT_NE(once, other) << "p " << p;
    // Accumulating adds the masked values.
    std::vector<float> twice = once;
    lora_dropout_apply(twice.data(), ones.data(), n, kFeatures, whole, true);
    for (size_t i = 0; i < twice.size(); ++i) ASSERT_EQ(twice[i], 2.0f * once[i]);
  }
}

// PEFT's per-expert delta, written from its code (ParamWrapper.get_delta_weight with swapped
// in/out features): A (E R, in) viewed (E, R, in), B (out, R E) viewed (out, R, E),
// delta[e, o, i] = scaling * sum_r B[o, r, e] A[e, r, i] ("o r e, e r i -> e o i").
double peft_delta(const std::vector<float>& a, const std::vector<float>& b, int64_t e, int64_t o,
                  int64_t i, int64_t n_experts, int64_t rank, int64_t in, int64_t b_row0,
                  double scaling) {
  double sum = 0.0;
  for (int64_t r = 0; r < rank; ++r) {
    sum += static_cast<double>(b[static_cast<size_t>(((b_row0 + o) * rank + r) * n_experts + e)]) *
           a[static_cast<size_t>((e * rank + r) * in + i)];
  }
  return scaling * sum;
}

// The merged weights equal W + PEFT's delta; A's and B's gradients equal the delta's chain rule
// of a given merged-weight gradient G (dL/dA = sum G * d delta / dA), both computed in double.
TEST(ExpertLora, EqualsPeftsParamWrapper) {
  constexpr int64_t E = 3, h = 20, im = 12, r = 2;
  constexpr float scaling = 2.5f;
  const int64_t gu_rank = 2 * r;  // gate_up_proj's fused pair
  const std::vector<float> wg = random_values(E * im * h, 11), wu = random_values(E * im * h, 12),
                           wd = random_values(E * h * im, 13),
                           gu_a = random_values(E * gu_rank * h, 14),
                           gu_b = random_values(2 * im * gu_rank * E, 15),
                           d_a = random_values(E * r * im, 16), d_b = random_values(h * r * E, 17),
                           gg = random_values(E * im * h, 18), gup = random_values(E * im * h, 19),
                           gd = random_values(E * h * im, 20);
  std::vector<float> gu_da(gu_a.size(), 0.0f), gu_db(gu_b.size(), 0.0f), d_da(d_a.size(), 0.0f),
      d_db(d_b.size(), 0.0f);
  ExpertLoraScratch scratch;
  ExpertLora lora;
  lora.name = "model.layers.0.mlp.experts";
  lora.n_experts = E;
  lora.hidden = h;
  lora.inter = im;
  lora.scaling = scaling;
  lora.gate_up = {gu_rank, gu_a.data(), gu_b.data(), gu_da.data(), gu_db.data()};
  lora.down = {r, d_a.data(), d_b.data(), d_da.data(), d_db.data()};
  lora.scratch = &scratch;

  const ExpertWeights merged = lora.merged({wg.data(), wu.data(), wd.data()});
  std::vector<float> want_g(wg.size()), want_u(wu.size()), want_d(wd.size());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t o = 0; o < im; ++o) {
      for (int64_t i = 0; i < h; ++i) {
        const auto at = static_cast<size_t>((e * im + o) * h + i);
        want_g[at] =
            static_cast<float>(wg[at] + peft_delta(gu_a, gu_b, e, o, i, E, gu_rank, h, 0, scaling));
        want_u[at] = static_cast<float>(
            wu[at] + peft_delta(gu_a, gu_b, e, o, i, E, gu_rank, h, im, scaling));
      }
    }
    for (int64_t o = 0; o < h; ++o) {
      for (int64_t i = 0; i < im; ++i) {
        const auto at = static_cast<size_t>((e * h + o) * im + i);
        want_d[at] =
            static_cast<float>(wd[at] + peft_delta(d_a, d_b, e, o, i, E, r, im, 0, scaling));
      }
    }
  }
  const double tol = 1e-6;
  testing::expect_close("gate", merged.gate, want_g.data(), E * im * h, tol);
  testing::expect_close("up", merged.up, want_u.data(), E * im * h, tol);
  testing::expect_close("down", merged.down, want_d.data(), E * h * im, tol);

  // The gradient rooms come zeroed; the experts' backward would accumulate G into them.
  const ExpertGrads dmerged = lora.merged_grads();
  for (int64_t k = 0; k < E * im * h; ++k) {
    ASSERT_EQ(dmerged.gate[k], 0.0f);
    ASSERT_EQ(dmerged.down[k], 0.0f);
  }
  std::copy(gg.begin(), gg.end(), dmerged.gate);
  std::copy(gup.begin(), gup.end(), dmerged.up);
  std::copy(gd.begin(), gd.end(), dmerged.down);
  lora.backward(dmerged);
  // dL/dA[e, r, i] = scaling sum_o G[e, o, i] B[o, r, e]; dL/dB[o, r, e] = scaling sum_i
  // G[e, o, i] A[e, r, i]; gate's and up's B rows are B's halves and share A.
  std::vector<double> want_gu_da(gu_a.size()), want_gu_db(gu_b.size()), want_d_da(d_a.size()),
      want_d_db(d_b.size());
  const auto chain = [&](const std::vector<float>& g, const std::vector<float>& a,
                         const std::vector<float>& b, std::vector<double>& da,
                         std::vector<double>& db, int64_t rank, int64_t in, int64_t out,
                         int64_t b_row0) {
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          const double gv = g[static_cast<size_t>((e * out + o) * in + i)];
          for (int64_t j = 0; j < rank; ++j) {
            const auto b_at = static_cast<size_t>(((b_row0 + o) * rank + j) * E + e);
            const auto a_at = static_cast<size_t>((e * rank + j) * in + i);
            da[a_at] += scaling * gv * b[b_at];
            db[b_at] += scaling * gv * a[a_at];
          }
        }
      }
    }
  };
  chain(gg, gu_a, gu_b, want_gu_da, want_gu_db, gu_rank, h, im, 0);
  chain(gup, gu_a, gu_b, want_gu_da, want_gu_db, gu_rank, h, im, im);
  chain(gd, d_a, d_b, want_d_da, want_d_db, r, im, h, 0);
  const auto as_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  testing::expect_close("gate_up dA", gu_da.data(), as_float(want_gu_da).data(),
                        static_cast<int64_t>(gu_da.size()), 1e-5);
  testing::expect_close("gate_up dB", gu_db.data(), as_float(want_gu_db).data(),
                        static_cast<int64_t>(gu_db.size()), 1e-5);
  testing::expect_close("down dA", d_da.data(), as_float(want_d_da).data(),
                        static_cast<int64_t>(d_da.size()), 1e-5);
  testing::expect_close("down dB", d_db.data(), as_float(want_d_db).data(),
                        static_cast<int64_t>(d_db.size()), 1e-5);
}

// On a MoE model the MLP targets adapt the sparse layers' experts under PEFT's keys and shapes
// (gate_up_proj's pair rank 2r under base_layer when down_proj is adapted too) and leave the
// dense layer's MLP alone; the attention is adapted in every layer.
TEST(ExpertLora, AdapterNamesAndShapesAsPeft) {
  const ModelArgs args = test::tiny_moe();  // layer 0 sparse (E 4, Im 16), layer 1 dense; h 32
  LoraOptions options{4, 8.0, {"q_proj", "gate_proj", "up_proj", "down_proj"}};
  const std::vector<ParamGroupSpec> specs = lora_param_specs(args, options);
  ASSERT_EQ(specs.size(), 2u);
  std::vector<std::pair<std::string, std::vector<int64_t>>> got0, got1;
  for (const ParamSpec& p : specs[0].params) got0.emplace_back(p.name, p.shape);
  for (const ParamSpec& p : specs[1].params) got1.emplace_back(p.name, p.shape);
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want0 = {
      {l0 + "self_attn.q_proj.lora_A.weight", {4, 32}},
      {l0 + "self_attn.q_proj.lora_B.weight", {64, 4}},
      {l0 + "mlp.experts.base_layer.lora_A.weight", {4 * 8, 32}},
      {l0 + "mlp.experts.base_layer.lora_B.weight", {32, 8 * 4}},
      {l0 + "mlp.experts.lora_A.weight", {4 * 4, 16}},
      {l0 + "mlp.experts.lora_B.weight", {32, 4 * 4}}};
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want1 = {
      {l1 + "self_attn.q_proj.lora_A.weight", {4, 32}},
      {l1 + "self_attn.q_proj.lora_B.weight", {64, 4}}};
  EXPECT_EQ(got0, want0);
  EXPECT_EQ(got1, want1);
  // Without down_proj, gate_up_proj's pair is the only wrapper: no base_layer.
  options.target_modules = {"gate_proj", "up_proj"};
  EXPECT_EQ(lora_param_specs(args, options)[0].params[0].name, l0 + "mlp.experts.lora_A.weight");
  const LoraAdapter adapter(args, {4, 8.0, {"q_proj", "gate_proj", "up_proj", "down_proj"}});
  ASSERT_EQ(adapter.experts().size(), 1u);
  EXPECT_EQ(adapter.find_experts(l0 + "mlp.experts")->gate_up.rank, 8);
  EXPECT_EQ(adapter.find_experts(l0 + "mlp.experts")->down.rank, 4);
  EXPECT_EQ(adapter.find(l1 + "mlp.gate_proj"), nullptr);
  // PEFT refuses gate_proj without up_proj on these models: so does titan.
  options.target_modules = {"q_proj", "gate_proj"};
  EXPECT_THROW(lora_param_specs(args, options), Error);
}

}  // namespace
}  // namespace titan
