// The CUDA kernels' bodies (src/titan/ops/cuda/*_rows.h, `__host__ __device__`) run on the host
// against the CPU ops' fp32 references: the same indexing, striding and barriers the kernels run,
// checked without a GPU. A body split over a team runs twice: over one thread (HostTeam) and over
// five threads with real barriers (ThreadTeam, the shape of the device's BlockTeam: every member
// strides by the team's size, reductions go through one slot per member between two barriers),
// five so that no length below divides evenly. What this cannot check -- the launch
// configurations, shared memory, the device's own arithmetic -- titan_cuda_kernels_test checks on
// a GPU.
//
// Tolerances are normwise (compare.h: max |got - ref| / max |ref|) against fp64-sum references:
// an fp32 sum of n terms errs by at most about n * 2^-24 of the sum of magnitudes, so each check
// allows kSlack times that for its longest sum (and the few ulps of expf/logf/sqrtf).
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/dtype.h"
#include "titan/core/rng.h"
#include "titan/ops/adamw.h"
#include "titan/ops/attention.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/bias.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/cuda/attention_rows.h"
#include "titan/ops/cuda/cross_entropy_rows.h"
#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/gemv_rows.h"
#include "titan/ops/cuda/lora_rows.h"
#include "titan/ops/cuda/moe_rows.h"
#include "titan/ops/cuda/norm_rows.h"
#include "titan/ops/cuda/step_arrays_rows.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/embedding.h"
#include "titan/ops/gemv.h"
#include "titan/ops/lora_dropout.h"
#include "titan/ops/moe.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/rope.h"
#include "titan/ops/swiglu.h"
#include "unit/attention_bf16_bounds.h"
#include "unit/compare.h"

namespace titan {
namespace {

using testing::expect_close;

constexpr double kSlack = 4.0;
double sum_tolerance(int64_t longest_sum) {
  return kSlack * static_cast<double>(longest_sum + 8) * std::ldexp(1.0, -24);
}

std::vector<float> randn(int64_t n, uint64_t seed, float std = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng(seed).fill_normal(v.data(), n, 0.0f, std);
  return v;
}

// A team of real threads, BlockTeam's protocol on the host.
struct TeamShared {
  explicit TeamShared(int n) : barrier(n), slots(static_cast<size_t>(n)) {}
  std::barrier<> barrier;
  std::vector<double> slots;
};

class ThreadTeam {
 public:
  ThreadTeam(TeamShared& shared, int rank, int size) : shared_(&shared), rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  void sync() const { shared_->barrier.arrive_and_wait(); }
  float sum(float v) const {
    return static_cast<float>(
        reduce(v, [](double a, double b) { return static_cast<float>(a + b); }));
  }
  double sum(double v) const {
    return reduce(v, [](double a, double b) { return a + b; });
  }
  float max(float v) const {
    return static_cast<float>(reduce(v, [](double a, double b) { return std::max(a, b); }));
  }

 private:
  template <typename Op>
  double reduce(double v, Op op) const {
    sync();
    shared_->slots[static_cast<size_t>(rank_)] = v;
    sync();
    double total = shared_->slots[0];
    for (int r = 1; r < size_; ++r) total = op(total, shared_->slots[static_cast<size_t>(r)]);
    return total;
  }
  TeamShared* shared_;
  int rank_, size_;
};

constexpr int kTeamSizes[] = {1, 5};

// body(team, tile) for every block `rows` of a kernel, over a team of `size` members; tile holds
// tile_per_member floats per member, shared by the team as the kernel's shared memory is.
template <typename Body>
void run_blocks(int size, int64_t rows, int tile_per_member, Body body) {
  std::vector<float> tile(static_cast<size_t>(size * tile_per_member));
  for (int64_t row = 0; row < rows; ++row) {
    if (size == 1) {
      body(cuda_rows::HostTeam{}, tile.data(), row);
      continue;
    }
    TeamShared shared(size);
    std::vector<std::thread> members;
    for (int r = 0; r < size; ++r) {
      members.emplace_back([&, r] { body(ThreadTeam(shared, r, size), tile.data(), row); });
    }
    for (std::thread& t : members) t.join();
  }
}

TEST(CudaRows, RmsNormMatchesReference) {
  for (const int64_t dim : {int64_t{100}, int64_t{64}}) {  // a hidden size and a q/k norm's head
    const int64_t rows = 7;
    const std::vector<float> x = randn(rows * dim, 1), w = randn(dim, 2),
                             dout = randn(rows * dim, 3);
    std::vector<float> ref_out(x.size()), ref_rstd(rows), ref_dx(x.size()), ref_dw(dim, 0.5f);
    rms_norm_forward_reference(ref_out.data(), ref_rstd.data(), x.data(), w.data(), rows, dim,
                               1e-6f);
    rms_norm_backward_reference(ref_dx.data(), ref_dw.data(), dout.data(), x.data(), w.data(),
                                ref_rstd.data(), rows, dim);
    for (const int size : kTeamSizes) {
      std::vector<float> out(x.size()), rstd(rows), dx(x.size()), dw(dim, 0.5f);
      run_blocks(size, rows, 0, [&](const auto& team, float*, int64_t r) {
        cuda_rows::rms_norm_row_forward(team, out.data() + r * dim, rstd.data() + r,
                                        x.data() + r * dim, w.data(), dim, 1e-6f);
      });
      for (int64_t col = 0; col < dim; ++col) {
        cuda_rows::rms_norm_dweight_column(dw.data(), dout.data(), x.data(), rstd.data(), rows, dim,
                                           col);
      }
      // dx written over a copy of dout, as the kernel may (dx aliasing dout).
      dx = dout;
      run_blocks(size, rows, 0, [&](const auto& team, float*, int64_t r) {
        cuda_rows::rms_norm_row_backward(team, dx.data() + r * dim, dx.data() + r * dim,
                                         x.data() + r * dim, w.data(), rstd[r], dim);
      });
      const double tol = sum_tolerance(dim);
      expect_close("rms_norm out", out.data(), ref_out.data(), rows * dim, tol);
      expect_close("rms_norm rstd", rstd.data(), ref_rstd.data(), rows, tol);
      expect_close("rms_norm dx", dx.data(), ref_dx.data(), rows * dim, tol);
      expect_close("rms_norm dweight", dw.data(), ref_dw.data(), dim, sum_tolerance(rows));
    }
  }
}

// The decode GEMV's row body against ops/gemv's reference (fp64 sums, x rounded to bf16 for a bf16
// weight), fp32 and bf16 weights, over columns a multiple of the 8-element chunk and not (100: 12
// chunks and 4 elements past them), read in chunks and singly: both paths of gemv.cu.
TEST(CudaRows, GemvMatchesReference) {
  const int64_t rows = 7;
  for (const int64_t cols : {int64_t{100}, int64_t{64}}) {
    const std::vector<float> w = randn(rows * cols, 11), x = randn(cols, 12);
    std::vector<uint16_t> w_bf16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w_bf16[i] = f32_to_bf16(w[i]);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const void* data = dtype == DType::bf16 ? static_cast<const void*>(w_bf16.data()) : w.data();
      std::vector<float> ref(rows);
      const GemvProduct product{{dtype, data, rows, cols}, ref.data()};
      gemv_forward_reference(std::span<const GemvProduct>(&product, 1), x.data());
      for (const bool chunked : {true, false}) {
        for (const int size : kTeamSizes) {
          std::vector<float> y(rows);
          run_blocks(size, rows, 0, [&](const auto& team, float*, int64_t r) {
            const float dot =
                dtype == DType::bf16
                    ? cuda_rows::gemv_row(team, w_bf16.data() + r * cols, x.data(), cols, chunked)
                    : cuda_rows::gemv_row(team, w.data() + r * cols, x.data(), cols, chunked);
            if (team.rank() == 0) y[static_cast<size_t>(r)] = dot;
          });
          expect_close("gemv " + std::string(dtype_name(dtype)), y.data(), ref.data(), rows,
                       sum_tolerance(cols));
        }
      }
    }
  }
}

TEST(CudaRows, RopeMatchesReferenceAndItsTranspose) {
  RopeParams rope;
  rope.head_dim = 64;
  rope.theta = 500000.0;
  rope.scaling.type = "llama3";
  rope.scaling.factor = 8.0;
  rope.scaling.original_max_position_embeddings = 64;
  const int64_t n = 9, heads = 3, half = rope.head_dim / 2;
  const RopeCache cache = rope_cache_build(rope, 100);
  const std::vector<int32_t> positions = {0, 5, 99, 1, 2, 3, 60, 61, 17};
  const std::vector<float> x = randn(n * heads * rope.head_dim, 4);
  std::vector<float> got = x, want = x;
  for (int64_t pair = 0; pair < n * heads * half; ++pair) {
    cuda_rows::rope_rotate_pair(got.data(), positions.data(), cache.cos(), cache.sin(), half, heads,
                                pair, 1.0f);
  }
  rope_forward_reference(want.data(), positions.data(), rope, n, heads);
  expect_close("rope forward", got.data(), want.data(), got.size(), sum_tolerance(2));
  // The backward's rotation is the CPU op's (there is no separate reference).
  got = x;
  want = x;
  for (int64_t pair = 0; pair < n * heads * half; ++pair) {
    cuda_rows::rope_rotate_pair(got.data(), positions.data(), cache.cos(), cache.sin(), half, heads,
                                pair, -1.0f);
  }
  rope_backward(want.data(), positions.data(), cache, n, heads);
  expect_close("rope backward", got.data(), want.data(), got.size(), sum_tolerance(2));
}

TEST(CudaRows, SwigluMatchesReferenceAndTheCpuBf16Forms) {
  const int64_t n = 1001;
  const std::vector<float> gate = randn(n, 5, 3.0f), up = randn(n, 6), dout = randn(n, 7);
  std::vector<float> out(n), ref_out(n), dgate(n), dup(n), ref_dgate(n), ref_dup(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = cuda_rows::swiglu(gate[i], up[i]);
    cuda_rows::swiglu_backward_element(&dgate[i], &dup[i], dout[i], gate[i], up[i]);
  }
  swiglu_forward_reference(ref_out.data(), gate.data(), up.data(), n);
  swiglu_backward_reference(ref_dgate.data(), ref_dup.data(), dout.data(), gate.data(), up.data(),
                            n);
  expect_close("swiglu out", out.data(), ref_out.data(), n, sum_tolerance(4));
  expect_close("swiglu dgate", dgate.data(), ref_dgate.data(), n, sum_tolerance(8));
  expect_close("swiglu dup", dup.data(), ref_dup.data(), n, sum_tolerance(4));
  // bf16: the kernels' roundings against the CPU's (whose sigmoid is a vector approximation), so
  // an element may land one bf16 ulp apart: at most 2^-7 of that element (bf16 keeps 8 significant
  // bits), so of the largest, normwise.
  std::vector<uint16_t> g16(n), u16(n), act(n), cpu_act(n), dg16(n), du16(n), cpu_dg(n), cpu_du(n);
  for (int64_t i = 0; i < n; ++i) {
    g16[i] = f32_to_bf16(gate[i]);
    u16[i] = f32_to_bf16(up[i]);
    act[i] = cuda_rows::to_bf16(
        cuda_rows::swiglu(cuda_rows::from_bf16(g16[i]), cuda_rows::from_bf16(u16[i])));
    float dg, du;
    cuda_rows::swiglu_backward_element(&dg, &du, dout[i], cuda_rows::from_bf16(g16[i]),
                                       cuda_rows::from_bf16(u16[i]));
    dg16[i] = cuda_rows::to_bf16(dg);
    du16[i] = cuda_rows::to_bf16(du);
  }
  swiglu_recompute_bf16(cpu_act.data(), g16.data(), u16.data(), n);
  swiglu_backward_bf16(cpu_dg.data(), cpu_du.data(), dout.data(), g16.data(), u16.data(), n);
  const auto widen = [](const std::vector<uint16_t>& bits) {
    std::vector<float> f(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_f32(bits[i]);
    return f;
  };
  const double bf16_tol = std::ldexp(1.0, -7);
  expect_close("swiglu recompute_bf16", widen(act).data(), widen(cpu_act).data(), n, bf16_tol);
  expect_close("swiglu backward_bf16 dgate", widen(dg16).data(), widen(cpu_dg).data(), n, bf16_tol);
  expect_close("swiglu backward_bf16 dup", widen(du16).data(), widen(cpu_du).data(), n, bf16_tol);
}

TEST(CudaRows, Bf16CastsAreTheCoreConversions) {
  const float cases[] = {0.0f,     -0.0f,    1.0f,      1.00390625f, 1.01171875f, 3.0e-39f,
                         -3.0e38f, INFINITY, -INFINITY, NAN,         65504.0f,    1.0e-45f};
  for (const float f : cases) {
    EXPECT_EQ(cuda_rows::to_bf16(f), f32_to_bf16(f)) << f;
    const uint16_t b = f32_to_bf16(f);
    const float back = cuda_rows::from_bf16(b), want = bf16_to_f32(b);
    EXPECT_EQ(std::memcmp(&back, &want, 4), 0) << f;
  }
  for (const float f : randn(4096, 8, 100.0f)) EXPECT_EQ(cuda_rows::to_bf16(f), f32_to_bf16(f));
}

TEST(CudaRows, EmbeddingMatchesTheCpuOp) {
  const int64_t vocab = 11, dim = 13, n = 17;
  const std::vector<float> weight = randn(vocab * dim, 9), dout = randn(n * dim, 10);
  const std::vector<int32_t> ids = {3, 0, 10, 3, 3, 7, 1, 2, 10, 5, 5, 4, 9, 8, 6, 3, 0};
  std::vector<float> out(n * dim), ref(n * dim), dw(vocab * dim, 0.25f), ref_dw(dw);
  for (int64_t e = 0; e < n * dim; ++e) {
    cuda_rows::embedding_gather_element(out.data(), ids.data(), weight.data(), dim, e);
  }
  for (int64_t col = 0; col < dim; ++col) {
    cuda_rows::embedding_scatter_column(dw.data(), dout.data(), ids.data(), n, dim, col);
  }
  embedding_forward(ref.data(), ids.data(), weight.data(), n, vocab, dim);
  std::vector<uint16_t> w16(weight.size());
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = f32_to_bf16(weight[i]);
  std::vector<float> out16(n * dim), ref16(n * dim);
  for (int64_t e = 0; e < n * dim; ++e) {
    cuda_rows::embedding_gather_element_bf16(out16.data(), ids.data(), w16.data(), dim, e);
  }
  embedding_forward_bf16(ref16.data(), ids.data(), w16.data(), n, vocab, dim);
  expect_close("embedding out (bf16 weight)", out16.data(), ref16.data(), out16.size(), 0.0);
  embedding_backward(ref_dw.data(), dout.data(), ids.data(), n, dim);
  // A gather is exact; the scatter adds repeated ids in token order, as the CPU's does.
  expect_close("embedding out", out.data(), ref.data(), out.size(), 0.0);
  expect_close("embedding dweight", dw.data(), ref_dw.data(), dw.size(), sum_tolerance(n));
}

// The linear's bias: the CPU's additions in the CPU's order, so bit-equal.
TEST(CudaRows, BiasIsTheCpuOpBitForBit) {
  const int64_t rows = 37, features = 263;
  const std::vector<float> y = randn(rows * features, 54), bias = randn(features, 55),
                           dy = randn(rows * features, 56), db = randn(features, 57);
  std::vector<float> got_y = y, got_db = db, want_y = y, want_db = db;
  for (int64_t e = 0; e < rows * features; ++e) {
    cuda_rows::bias_add_element(got_y.data(), bias.data(), features, e);
  }
  for (int64_t col = 0; col < features; ++col) {
    cuda_rows::bias_sum_column(got_db.data(), dy.data(), rows, features, col);
  }
  bias_forward(want_y.data(), bias.data(), rows, features);
  bias_backward(want_db.data(), dy.data(), rows, features);
  EXPECT_EQ(std::memcmp(got_y.data(), want_y.data(), got_y.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(got_db.data(), want_db.data(), got_db.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(got_db.data(), db.data(), db.size() * sizeof(float)), 0);
}

// LoRA's dropout: the CPU's mask for the same call and the CPU's products, bit for bit, forward
// (in place too, as the bf16 path calls it) and accumulating (the backward's dx); an odd feature
// count, rows across a sequence boundary, a TP-style first feature.
TEST(CudaRows, LoraDropoutIsTheCpuOpBitForBit) {
  for (uint64_t x : {0ull, 1ull, 0x9e3779b97f4a7c15ull, ~0ull}) {
    EXPECT_EQ(cuda_rows::mix64(x), mix64(x)) << x;
  }
  const int64_t n = 13, features = 37;
  const LoraDropoutCall call{0.3, mix64(mix64(1234 ^ 77) ^ 5), 6, 5, 11};
  const cuda_rows::DropoutKey key{call.p,       static_cast<float>(1.0 / (1.0 - call.p)),
                                  call.key,     call.first_row,
                                  call.seq_len, call.first_feature};
  const std::vector<float> x = randn(n * features, 58), base = randn(n * features, 59);
  for (const bool accumulate : {false, true}) {
    std::vector<float> got = accumulate ? base : std::vector<float>(x.size(), 0.0f), want = got;
    for (int64_t e = 0; e < n * features; ++e) {
      cuda_rows::lora_dropout_element(got.data(), x.data(), features, key, accumulate, e);
    }
    lora_dropout_apply(want.data(), x.data(), n, features, call, accumulate);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << accumulate;
  }
  std::vector<float> in_place = x;
  for (int64_t e = 0; e < n * features; ++e) {
    cuda_rows::lora_dropout_element(in_place.data(), in_place.data(), features, key, false, e);
  }
  std::vector<float> want(x.size());
  lora_dropout_apply(want.data(), x.data(), n, features, call, false);
  EXPECT_EQ(std::memcmp(in_place.data(), want.data(), want.size() * sizeof(float)), 0);
  // The check sees the mask: some elements dropped, some kept, and another key differs.
  const auto dropped = std::count(want.begin(), want.end(), 0.0f);
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, n * features);
  cuda_rows::DropoutKey other = key;
  other.key ^= 1;
  std::vector<float> moved(x.size());
  for (int64_t e = 0; e < n * features; ++e) {
    cuda_rows::lora_dropout_element(moved.data(), x.data(), features, other, false, e);
  }
  EXPECT_NE(std::memcmp(moved.data(), want.data(), want.size() * sizeof(float)), 0);
}

// LoRA's B^T: the CPU's transpose (a copy), element for element, over a non-square shape.
TEST(CudaRows, TransposeIsTheCpuOp) {
  const int64_t rows = 29, cols = 7;
  const std::vector<float> src = randn(rows * cols, 62);
  std::vector<float> got(src.size()), want(src.size());
  for (int64_t e = 0; e < rows * cols; ++e) {
    cuda_rows::transpose_element(got.data(), src.data(), rows, cols, e);
  }
  transpose(want.data(), src.data(), rows, cols);
  EXPECT_EQ(got, want);
  EXPECT_EQ(want[3 * rows + 5], src[5 * cols + 3]);
}

TEST(CudaRows, AdamwMatchesReference) {
  const int64_t n = 257;
  const std::vector<float> grad = randn(n, 11);
  std::vector<float> p = randn(n, 12), m = randn(n, 13, 0.1f), v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::fabs(randn(1, 14 + i)[0]) * 0.01f;
  std::vector<float> rp = p, rm = m, rv = v;
  AdamWConfig config;
  const AdamWScalars s = adamw_scalars(config, 3e-4f, 7);
  for (int64_t i = 0; i < n; ++i) cuda_rows::adamw_element(&p[i], grad[i], &m[i], &v[i], s);
  adamw_update_reference(rp.data(), grad.data(), rm.data(), rv.data(), n, s);
  expect_close("adamw param", p.data(), rp.data(), n, sum_tolerance(8));
  expect_close("adamw exp_avg", m.data(), rm.data(), n, sum_tolerance(4));
  expect_close("adamw exp_avg_sq", v.data(), rv.data(), n, sum_tolerance(4));
}

// step_arrays.cu's AdamW over arrays laid end to end (empty ones among them), clipping's scale
// applied as each gradient is read: bit-equal to the CPU's way, the gradients scaled in place by
// scale_in_place and each array updated by the same element body, and the gradients left as they
// were.
TEST(CudaRows, AdamwOverEveryArrayIsScaleThenAdamwPerArray) {
  const std::vector<int64_t> sizes = {0, 257, 1, 0, 1000, 3};
  const float grad_scale = 0.37f;
  const AdamWScalars s = adamw_scalars(AdamWConfig{}, 3e-4f, 7);
  std::vector<std::vector<float>> p, g, m, v;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const int64_t n = sizes[j];
    p.push_back(randn(n, 20 + j));
    g.push_back(randn(n, 30 + j));
    m.push_back(randn(n, 40 + j, 0.1f));
    std::vector<float> sq = randn(n, 50 + j, 0.1f);
    for (float& x : sq) x = x * x;
    v.push_back(sq);
  }
  auto want_p = p, want_g = g, want_m = m, want_v = v;
  std::vector<AdamWArrays> table;
  std::vector<int64_t> starts = {0};
  for (size_t j = 0; j < sizes.size(); ++j) {
    table.push_back({p[j].data(), g[j].data(), m[j].data(), v[j].data(), sizes[j]});
    starts.push_back(starts.back() + sizes[j]);
    scale_in_place(want_g[j].data(), grad_scale, sizes[j]);
    for (int64_t i = 0; i < sizes[j]; ++i) {
      cuda_rows::adamw_element(&want_p[j][i], want_g[j][i], &want_m[j][i], &want_v[j][i], s);
    }
  }
  const auto count = static_cast<int64_t>(table.size());
  for (int64_t i = 0; i < starts.back(); ++i) {
    cuda_rows::adamw_all_element(table.data(), starts.data(), count, i, s, grad_scale);
  }
  for (size_t j = 0; j < sizes.size(); ++j) {
    if (sizes[j] == 0) continue;  // an empty vector's data() may be null: memcmp's undefined there
    const size_t bytes = sizeof(float) * static_cast<size_t>(sizes[j]);
    EXPECT_EQ(std::memcmp(p[j].data(), want_p[j].data(), bytes), 0) << "param of array " << j;
    EXPECT_EQ(std::memcmp(m[j].data(), want_m[j].data(), bytes), 0) << "exp_avg of array " << j;
    EXPECT_EQ(std::memcmp(v[j].data(), want_v[j].data(), bytes), 0) << "exp_avg_sq of array " << j;
    EXPECT_EQ(g[j], randn(sizes[j], 30 + j)) << "grad of array " << j << " changed";
  }
  // The scale was applied: the unscaled update of array 1 gives other params.
  std::vector<float> unscaled = randn(257, 21);
  std::vector<float> um = randn(257, 41, 0.1f), uv = randn(257, 51, 0.1f);
  for (float& x : uv) x = x * x;
  const std::vector<float> g1 = randn(257, 31);
  for (int64_t i = 0; i < 257; ++i)
    cuda_rows::adamw_element(&unscaled[i], g1[i], &um[i], &uv[i], s);
  EXPECT_NE(std::memcmp(unscaled.data(), p[1].data(), sizeof(float) * 257), 0);
}

// step_arrays.cu's bf16 casts of several arrays at once (empty ones among them, NaN and infinity
// in them): bit-equal to the CPU's round_to_bf16 per array.
TEST(CudaRows, RoundEveryArrayIsRoundToBf16PerArray) {
  const std::vector<int64_t> sizes = {5, 0, 1031, 1};
  std::vector<std::vector<float>> src;
  std::vector<std::vector<uint16_t>> got, want;
  std::vector<Bf16Cast> table;
  std::vector<int64_t> starts = {0};
  for (size_t j = 0; j < sizes.size(); ++j) {
    src.push_back(randn(sizes[j], 110 + j));
    got.emplace_back(sizes[j], 0);
    want.emplace_back(sizes[j], 0);
  }
  src[0][1] = NAN;
  src[0][3] = -INFINITY;
  for (size_t j = 0; j < sizes.size(); ++j) {
    table.push_back({got[j].data(), src[j].data(), sizes[j]});
    starts.push_back(starts.back() + sizes[j]);
    round_to_bf16(want[j].data(), src[j].data(), sizes[j]);
  }
  for (int64_t i = 0; i < starts.back(); ++i) {
    cuda_rows::round_all_element(table.data(), starts.data(), static_cast<int64_t>(table.size()),
                                 i);
  }
  EXPECT_EQ(got, want);
}

TEST(CudaRows, ArrayOfSkipsEmptyArrays) {
  const std::vector<int64_t> starts = {0, 0, 5, 5, 5, 6};  // sizes 0, 5, 0, 0, 1
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(cuda_rows::array_of(starts.data(), 5, i), 1) << i;
  EXPECT_EQ(cuda_rows::array_of(starts.data(), 5, 5), 4);
}

// step_arrays.cu's sum of squares: every thread's strided share of each array over the launch's
// grid (1024 blocks of 256), added per array and then over the arrays, against the CPU's
// sum_squares_f64 per array summed in the same order (fp64 sums in other orders: within n ulps).
TEST(CudaRows, SumSquaresSharesCoverEveryElement) {
  const std::vector<int64_t> sizes = {300007, 0, 1, 262145};
  const int64_t stride = int64_t{1024} * 256;
  double got = 0.0, want = 0.0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const std::vector<float> x = randn(sizes[j], 60 + j);
    double array_total = 0.0;
    for (int64_t first = 0; first < stride; ++first) {
      array_total += cuda_rows::sum_squares_share(x.data(), sizes[j], first, stride);
    }
    got += array_total;
    want += sum_squares_f64(x.data(), sizes[j]);
  }
  EXPECT_NEAR(got, want, 1e-15 * 600000 * want);
  EXPECT_GT(want, 500000.0);  // about one per element
}

// cross_entropy.cu's chunk loop replayed on the host: the logits GEMM, the row body over each
// row, the two backward GEMMs, against the reference loss (whole logits, fp64 softmax).
TEST(CudaRows, CrossEntropyRowsMatchReference) {
  const int64_t n = 13, hidden = 16, vocab = 50, chunk = 5;
  const std::vector<float> x = randn(n * hidden, 15), w = randn(vocab * hidden, 16, 0.5f);
  std::vector<int32_t> targets(n);
  for (int64_t t = 0; t < n; ++t)
    targets[t] = t % 4 == 3 ? kIgnoreIndex : static_cast<int32_t>((t * 7) % vocab);
  const float grad_scale = 1.0f / 10.0f;
  CrossEntropyArgs ref;
  ref.x = x.data();
  ref.weight = w.data();
  ref.targets = targets.data();
  ref.n_tokens = n;
  ref.hidden = hidden;
  ref.vocab = vocab;
  std::vector<float> ref_dx(n * hidden), ref_dw(vocab * hidden, 0.0f);
  ref.dx = ref_dx.data();
  ref.dweight = ref_dw.data();
  ref.grad_scale = grad_scale;
  const CrossEntropyResult want = lm_head_cross_entropy_reference(ref);
  for (const int size : kTeamSizes) {
    std::vector<float> logits(chunk * vocab), dx(n * hidden), dw(vocab * hidden, 0.0f);
    double loss_sum = 0.0;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t rows = std::min(chunk, n - t0);
      gemm_f32_reference(Trans::no, Trans::yes, rows, vocab, hidden, 1.0f, x.data() + t0 * hidden,
                         hidden, w.data(), hidden, 0.0f, logits.data(), vocab);
      std::vector<float> row_loss(rows);
      run_blocks(size, rows, 0, [&](const auto& team, float*, int64_t r) {
        const float loss =
            cuda_rows::cross_entropy_row(team, logits.data() + r * vocab, targets[t0 + r],
                                         kIgnoreIndex, vocab, true, grad_scale);
        if (team.rank() == 0) row_loss[r] = loss;
      });
      for (const float l : row_loss) loss_sum += l;
      gemm_f32_reference(Trans::no, Trans::no, rows, hidden, vocab, 1.0f, logits.data(), vocab,
                         w.data(), hidden, 0.0f, dx.data() + t0 * hidden, hidden);
      gemm_f32_reference(Trans::yes, Trans::no, vocab, hidden, rows, 1.0f, logits.data(), vocab,
                         x.data() + t0 * hidden, hidden, 1.0f, dw.data(), hidden);
    }
    EXPECT_NEAR(loss_sum, want.loss_sum, sum_tolerance(vocab + hidden) * want.loss_sum);
    expect_close("cross_entropy dx", dx.data(), ref_dx.data(), dx.size(), sum_tolerance(vocab));
    expect_close("cross_entropy dweight", dw.data(), ref_dw.data(), dw.size(), sum_tolerance(n));
  }
}

// The bf16 form against the CPU op's own bf16 path (lm_head_cross_entropy with weight_bf16), the
// chunk loop replayed on the host with the CPU backend's GEMMs -- the same bf16-to-bf16 logits
// GEMM, so the row body sees the CPU's bf16 logits bit for bit. The max is exact; the sum of
// exp(logit - max) is fp32 in another order with another exp (the CPU's is a vector
// approximation), so a row's loss may differ by the fp32 sum's bound, and an element of the bf16
// d loss / d logits by one bf16 rounding: 2^-7 of it (8 significant bits; rounded from a value
// within a few fp32 ulps of the CPU's). dx and dweight are bf16 GEMMs over those elements, so an
// element of them differs by at most 2^-7 of sum_j |G_j| |W_j| (the bound of the products'
// magnitudes), plus the fp32 sum's bound for the CPU's other summation order (vocabulary slices).
TEST(CudaRows, CrossEntropyBf16RowsMatchTheCpuBf16Op) {
  const int64_t n = 13, hidden = 16, vocab = 50, chunk = 5;
  const std::vector<float> x = randn(n * hidden, 15), w = randn(vocab * hidden, 16, 0.5f);
  std::vector<uint16_t> w16(w.size()), x16(x.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_bf16(w[i]);
  for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
  std::vector<int32_t> targets(n);
  for (int64_t t = 0; t < n; ++t)
    targets[t] = t % 4 == 3 ? kIgnoreIndex : static_cast<int32_t>((t * 7) % vocab);
  const float grad_scale = 1.0f / 10.0f;
  CrossEntropyArgs cpu;
  cpu.x = x.data();
  cpu.weight = w.data();
  cpu.weight_bf16 = w16.data();
  std::vector<uint16_t> cpu_x16(x.size());
  cpu.x_bf16 = cpu_x16.data();
  cpu.targets = targets.data();
  cpu.n_tokens = n;
  cpu.hidden = hidden;
  cpu.vocab = vocab;
  cpu.chunk_tokens = chunk;
  std::vector<float> cpu_dx(n * hidden), cpu_dw(vocab * hidden, 0.25f);
  cpu.dx = cpu_dx.data();
  cpu.dweight = cpu_dw.data();
  cpu.grad_scale = grad_scale;
  const CrossEntropyResult want = lm_head_cross_entropy(cpu);
  EXPECT_EQ(cpu_x16, x16);
  for (const int size : kTeamSizes) {
    std::vector<uint16_t> logits(chunk * vocab);
    std::vector<float> dx(n * hidden), dw(vocab * hidden, 0.25f);
    std::vector<double> dx_bound(dx.size(), 0.0), dw_bound(dw.size(), 0.0);
    double loss_sum = 0.0;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t rows = std::min(chunk, n - t0);
      backend().gemm_bf16_to_bf16(Trans::no, Trans::yes, rows, vocab, hidden, 1.0f,
                                  x16.data() + t0 * hidden, hidden, w16.data(), hidden,
                                  logits.data(), vocab);
      std::vector<double> row_loss(rows);
      run_blocks(size, rows, 0, [&](const auto& team, float*, int64_t r) {
        const double loss =
            cuda_rows::cross_entropy_row_bf16(team, logits.data() + r * vocab, targets[t0 + r],
                                              kIgnoreIndex, vocab, true, grad_scale);
        if (team.rank() == 0) row_loss[r] = loss;
      });
      for (const double l : row_loss) loss_sum += l;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < vocab; ++j) {
          const double g = std::fabs(bf16_to_f32(logits[r * vocab + j]));
          for (int64_t c = 0; c < hidden; ++c) {
            dx_bound[(t0 + r) * hidden + c] += g * std::fabs(bf16_to_f32(w16[j * hidden + c]));
            dw_bound[j * hidden + c] += g * std::fabs(bf16_to_f32(x16[(t0 + r) * hidden + c]));
          }
        }
      }
      backend().gemm_bf16(Trans::no, Trans::no, rows, hidden, vocab, 1.0f, logits.data(), vocab,
                          w16.data(), hidden, 0.0f, dx.data() + t0 * hidden, hidden);
      backend().gemm_bf16(Trans::yes, Trans::no, vocab, hidden, rows, 1.0f, logits.data(), vocab,
                          x16.data() + t0 * hidden, hidden, 1.0f, dw.data(), hidden);
    }
    EXPECT_NEAR(loss_sum, want.loss_sum, sum_tolerance(vocab) * want.loss_sum) << size;
    const double per_product = std::ldexp(1.0, -7) + sum_tolerance(vocab);
    for (size_t e = 0; e < dx.size(); ++e) {
      ASSERT_LE(std::fabs(dx[e] - cpu_dx[e]), per_product * dx_bound[e] + 1e-30) << "dx " << e;
    }
    for (size_t e = 0; e < dw.size(); ++e) {
      // Plus the rounding of the additions to the starting 0.25, in either order.
      ASSERT_LE(std::fabs(dw[e] - cpu_dw[e]), per_product * dw_bound[e] + sum_tolerance(n) * 0.25)
          << "dw " << e;
    }
    // An ignored row's gradient is zero, so its dx row is exactly zero in both.
    for (int64_t c = 0; c < hidden; ++c) EXPECT_EQ(dx[3 * hidden + c], 0.0f);
  }
}

struct AttentionCase {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
};

TEST(CudaRows, AttentionMatchesReference) {
  // GQA ratios 1, 2 and 8; head dims 64 and 128; 37 positions (no tile divides them); and queries
  // that are the last 5 of 37 keys (a prefill continuing a cache).
  const AttentionCase cases[] = {
      {2, 37, 37, 8, 8, 64}, {1, 37, 37, 8, 4, 128}, {2, 37, 37, 8, 1, 64}, {1, 5, 37, 4, 2, 64}};
  for (const AttentionCase& c : cases) {
    AttentionShape shape;
    shape.batch = c.batch;
    shape.seq_q = c.seq_q;
    shape.seq_kv = c.seq_kv;
    shape.n_heads = c.heads;
    shape.n_kv_heads = c.kv_heads;
    shape.head_dim = c.head_dim;
    const cuda_rows::AttentionDims s{c.batch,
                                     c.seq_q,
                                     c.seq_kv,
                                     c.heads,
                                     c.kv_heads,
                                     c.head_dim,
                                     1.0f / std::sqrt(static_cast<float>(c.head_dim))};
    const int64_t nq = c.batch * c.seq_q * c.heads * c.head_dim;
    const int64_t nkv = c.batch * c.seq_kv * c.kv_heads * c.head_dim;
    const std::vector<float> q = randn(nq, 20), k = randn(nkv, 21), v = randn(nkv, 22),
                             dout = randn(nq, 23);
    const int64_t lse_n = c.batch * c.heads * c.seq_q;
    std::vector<float> ref_out(nq), ref_lse(lse_n), ref_dq(nq), ref_dk(nkv), ref_dv(nkv);
    attention_forward_reference(ref_out.data(), ref_lse.data(), q.data(), k.data(), v.data(),
                                shape);
    attention_backward_reference(ref_dq.data(), ref_dk.data(), ref_dv.data(), dout.data(), q.data(),
                                 k.data(), v.data(), ref_out.data(), ref_lse.data(), shape);
    const double tol = sum_tolerance(c.head_dim + c.seq_kv * c.heads / c.kv_heads);
    for (const int size : kTeamSizes) {
      std::vector<float> out(nq, NAN), lse(lse_n, NAN), dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN);
      run_blocks(size, c.batch * c.seq_q * c.heads, 1,
                 [&](const auto& team, float* tile, int64_t row) {
                   cuda_rows::attention_forward_query(team, tile, out.data(), lse.data(), q.data(),
                                                      k.data(), v.data(), s, row);
                 });
      run_blocks(
          size, c.batch * c.seq_q * c.heads, 1, [&](const auto& team, float* tile, int64_t row) {
            cuda_rows::attention_backward_query(team, tile, dq.data(), dout.data(), q.data(),
                                                k.data(), v.data(), out.data(), lse.data(), s, row);
          });
      run_blocks(size, c.batch * c.seq_kv * c.kv_heads, 2,
                 [&](const auto& team, float* tile, int64_t row) {
                   cuda_rows::attention_backward_key(team, tile, dk.data(), dv.data(), dout.data(),
                                                     q.data(), k.data(), v.data(), out.data(),
                                                     lse.data(), s, row);
                 });
      const std::string at = " (B " + std::to_string(c.batch) + ", Sq " + std::to_string(c.seq_q) +
                             ", Skv " + std::to_string(c.seq_kv) + ", H/KV " +
                             std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + ", hd " +
                             std::to_string(c.head_dim) + ", team " + std::to_string(size) + ")";
      expect_close("attention out" + at, out.data(), ref_out.data(), nq, tol);
      expect_close("attention lse" + at, lse.data(), ref_lse.data(), lse_n, tol);
      expect_close("attention dq" + at, dq.data(), ref_dq.data(), nq, tol);
      expect_close("attention dk" + at, dk.data(), ref_dk.data(), nkv, tol);
      expect_close("attention dv" + at, dv.data(), ref_dv.data(), nkv, tol);
    }
  }
}

std::vector<uint16_t> rounded(const std::vector<float>& x) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = f32_to_bf16(x[i]);
  return bits;
}

// max |got - want| / bound over the elements: at most 1 when each is within its bound.
void expect_within(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& want, const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t e = 0; e < got.size(); ++e) {
    ASSERT_LE(std::fabs(static_cast<double>(got[e]) - want[e]), bound[e] + 1e-30)
        << what << " element " << e << ": " << got[e] << " vs " << want[e];
  }
}

// The bf16 forms against the CPU's own (attention_*_blockwise_bf16) on the same bf16 q, k, v (and
// out, and the CPU's lse for the backward, so each half is checked alone), each output element
// within the bound attention_bf16_bounds.h derives (one bf16 rounding step of its products, plus
// the fp32 check's bound).
TEST(CudaRows, AttentionBf16MatchesTheCpuBf16Forms) {
  const AttentionCase cases[] = {
      {2, 37, 37, 8, 8, 64}, {1, 37, 37, 8, 4, 128}, {2, 37, 37, 8, 1, 64}, {1, 5, 37, 4, 2, 64}};
  for (const AttentionCase& c : cases) {
    AttentionShape shape;
    shape.batch = c.batch;
    shape.seq_q = c.seq_q;
    shape.seq_kv = c.seq_kv;
    shape.n_heads = c.heads;
    shape.n_kv_heads = c.kv_heads;
    shape.head_dim = c.head_dim;
    const cuda_rows::AttentionDims s{c.batch,
                                     c.seq_q,
                                     c.seq_kv,
                                     c.heads,
                                     c.kv_heads,
                                     c.head_dim,
                                     1.0f / std::sqrt(static_cast<float>(c.head_dim))};
    const int64_t hd = c.head_dim;
    const int64_t nq = c.batch * c.seq_q * c.heads * hd;
    const int64_t nkv = c.batch * c.seq_kv * c.kv_heads * hd;
    const int64_t lse_n = c.batch * c.heads * c.seq_q;
    const std::vector<uint16_t> q = rounded(randn(nq, 30)), k = rounded(randn(nkv, 31)),
                                v = rounded(randn(nkv, 32));
    const std::vector<float> dout = randn(nq, 33);
    std::vector<float> cpu_out(nq), cpu_lse(lse_n), cpu_dq(nq), cpu_dk(nkv), cpu_dv(nkv);
    attention_forward_blockwise_bf16(cpu_out.data(), cpu_lse.data(), q.data(), k.data(), v.data(),
                                     shape);
    const std::vector<uint16_t> out16 = rounded(cpu_out);
    attention_backward_blockwise_bf16(cpu_dq.data(), cpu_dk.data(), cpu_dv.data(), dout.data(),
                                      q.data(), k.data(), v.data(), out16.data(), cpu_lse.data(),
                                      shape);
    const double tol = sum_tolerance(hd + c.seq_kv * c.heads / c.kv_heads);
    const test::AttentionBf16Bounds bound = test::attention_bf16_bounds(
        shape, q.data(), k.data(), v.data(), dout.data(), out16.data(), cpu_lse.data(), tol);
    const std::string at = " (B " + std::to_string(c.batch) + ", Sq " + std::to_string(c.seq_q) +
                           ", H/KV " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
                           ", hd " + std::to_string(hd) + ")";
    for (const int size : kTeamSizes) {
      std::vector<float> out(nq, NAN), lse(lse_n, NAN), dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN);
      run_blocks(size, c.batch * c.seq_q * c.heads, 1,
                 [&](const auto& team, float* tile, int64_t row) {
                   cuda_rows::attention_forward_query(team, tile, out.data(), lse.data(), q.data(),
                                                      k.data(), v.data(), s, row);
                 });
      run_blocks(size, c.batch * c.seq_q * c.heads, 1,
                 [&](const auto& team, float* tile, int64_t row) {
                   cuda_rows::attention_backward_query(team, tile, dq.data(), dout.data(), q.data(),
                                                       k.data(), v.data(), out16.data(),
                                                       cpu_lse.data(), s, row);
                 });
      run_blocks(size, c.batch * c.seq_kv * c.kv_heads, 2,
                 [&](const auto& team, float* tile, int64_t row) {
                   cuda_rows::attention_backward_key(team, tile, dk.data(), dv.data(), dout.data(),
                                                     q.data(), k.data(), v.data(), out16.data(),
                                                     cpu_lse.data(), s, row);
                 });
      const std::string team = at + " team " + std::to_string(size);
      expect_within("attention bf16 out" + team, out, cpu_out, bound.out);
      expect_close("attention bf16 lse" + team, lse.data(), cpu_lse.data(), lse_n, tol);
      expect_within("attention bf16 dq" + team, dq, cpu_dq, bound.dq);
      expect_within("attention bf16 dk" + team, dk, cpu_dk, bound.dk);
      expect_within("attention bf16 dv" + team, dv, cpu_dv, bound.dv);
    }
  }
}

// The rounding points themselves, where the bounds above would let a missing rounding pass: one
// row, two keys, inputs whose roundings sit far (over 1e-4 relative) from a bf16 midpoint, so any
// exp lands on the same side. Query 1 scores key 0 at 0 and key 1 at 2 / sqrt(64) = 0.25 (the row
// max): the forward's P = exp(score - max) = (0.7788008, 1) rounds to (0.77734375, 1) for P V and
// is divided by the unrounded sum 1.7788008; the backward's P = exp(score - lse) = 0.4378235 for
// key 0 rounds to 0.4375 for dv. The CPU's bf16 forms give the same values.
TEST(CudaRows, AttentionBf16RoundsPWhereTheCpuDoes) {
  const int64_t hd = 64;
  AttentionShape shape;
  shape.batch = shape.n_heads = shape.n_kv_heads = 1;
  shape.seq_q = shape.seq_kv = 2;
  shape.head_dim = hd;
  const cuda_rows::AttentionDims s{1, 2, 2, 1, 1, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  std::vector<float> qf(2 * hd, 0.0f), kf(2 * hd, 0.0f), vf(2 * hd, 0.0f), dout(2 * hd, 0.0f);
  qf[0] = qf[hd] = 1.0f;  // both queries (1, 0, ...)
  kf[hd] = 2.0f;          // key 0 zero, key 1 (2, 0, ...)
  vf[0] = 1.0f;           // v0 = e0, v1 = e1
  vf[hd + 1] = 1.0f;
  dout[hd] = 1.0f;  // only query 1's dout, e0
  const std::vector<uint16_t> q = rounded(qf), k = rounded(kf), v = rounded(vf);
  const double p0 = std::exp(-0.25), sum = p0 + 1.0;
  const double want_out = 0.77734375 / sum;         // round(exp(-0.25)) / sum
  ASSERT_GT(std::fabs(p0 / sum - want_out), 1e-4);  // an unrounded P would be told apart
  std::vector<float> out(2 * hd), lse(2), cpu_out(2 * hd), cpu_lse(2);
  run_blocks(1, 2, 1, [&](const auto& team, float* tile, int64_t row) {
    cuda_rows::attention_forward_query(team, tile, out.data(), lse.data(), q.data(), k.data(),
                                       v.data(), s, row);
  });
  attention_forward_blockwise_bf16(cpu_out.data(), cpu_lse.data(), q.data(), k.data(), v.data(),
                                   shape);
  EXPECT_NEAR(out[hd], want_out, 1e-6);
  EXPECT_NEAR(cpu_out[hd], want_out, 1e-6);
  EXPECT_NEAR(out[hd + 1], 1.0 / sum, 1e-6);
  // dv of key 0: query 0 sees only key 0 but has no dout; query 1's P for key 0 is p0 / sum.
  const double want_dv = 0.4375;  // round(0.4378235)
  ASSERT_GT(std::fabs(p0 / sum - want_dv), 1e-4);
  const std::vector<uint16_t> out16 = rounded(cpu_out);
  std::vector<float> dk(2 * hd), dv(2 * hd), cpu_dq(2 * hd), cpu_dk(2 * hd), cpu_dv(2 * hd);
  run_blocks(1, 2, 2, [&](const auto& team, float* tile, int64_t row) {
    cuda_rows::attention_backward_key(team, tile, dk.data(), dv.data(), dout.data(), q.data(),
                                      k.data(), v.data(), out16.data(), cpu_lse.data(), s, row);
  });
  attention_backward_blockwise_bf16(cpu_dq.data(), cpu_dk.data(), cpu_dv.data(), dout.data(),
                                    q.data(), k.data(), v.data(), out16.data(), cpu_lse.data(),
                                    shape);
  EXPECT_NEAR(dv[0], want_dv, 1e-6);
  EXPECT_NEAR(cpu_dv[0], want_dv, 1e-6);
}

bool same_bits(const void* a, const void* b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

// Top-k indices per token: k distinct experts of E, drawn from a seed.
std::vector<int32_t> routed_experts(int64_t n_tokens, int64_t n_experts, int64_t top_k,
                                    uint64_t seed) {
  std::vector<int32_t> index(static_cast<size_t>(n_tokens * top_k));
  Rng rng(seed);
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<int32_t> experts(static_cast<size_t>(n_experts));
    for (int64_t e = 0; e < n_experts; ++e) experts[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < top_k; ++j) {
      const auto pick = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n_experts - j));
      std::swap(experts[j], experts[j + pick]);
      index[t * top_k + j] = experts[j];
    }
  }
  return index;
}

// The router's ids are the CPU's, exact ties included (equal logits: the lower expert first), its
// probabilities and weights within the few ulps of expf against the CPU's exp approximation and
// the E-term sum; its backward is the CPU's operation for operation: the same bits.
TEST(CudaRows, RouterIdsAreTheCpuOpsAndItsBackwardTheSameBits) {
  const int64_t N = 37, E = 11;
  std::vector<float> logits = randn(N * E, 60, 2.0f);
  // Ties: token 3 has every logit equal, token 5 three equal maxima, token 8 a tie at the k-th.
  for (int64_t e = 0; e < E; ++e) logits[3 * E + e] = 0.25f;
  logits[5 * E + 2] = logits[5 * E + 7] = logits[5 * E + 9] = 9.0f;
  logits[8 * E + 4] = logits[8 * E + 1] = 5.0f;
  logits[8 * E + 0] = logits[8 * E + 6] = 3.0f;
  for (const int64_t k : {int64_t{1}, int64_t{3}, E}) {
    for (const bool norm : {true, false}) {
      const std::string name = " k " + std::to_string(k) + (norm ? " norm" : "");
      std::vector<int32_t> idx(N * k), cpu_idx(N * k);
      std::vector<float> w(N * k), cpu_w(N * k), probs(N * E), cpu_probs(N * E);
      for (int64_t t = 0; t < N; ++t) {
        cuda_rows::router_token_forward(idx.data(), w.data(), probs.data(), logits.data(), E, k,
                                        norm, t);
      }
      router_topk_forward(cpu_idx.data(), cpu_w.data(), cpu_probs.data(), logits.data(), N, E, k,
                          norm);
      EXPECT_EQ(idx, cpu_idx) << name;
      expect_close("router probs" + name, probs.data(), cpu_probs.data(), N * E, sum_tolerance(E));
      expect_close("router weights" + name, w.data(), cpu_w.data(), N * k, sum_tolerance(E + k));
      // The backward over the CPU's forward (the same inputs), with and without the
      // load-balancing gradient.
      const std::vector<float> dweight = randn(N * k, 61), dprobs_all = randn(E, 62, 0.01f);
      for (const float* all : {static_cast<const float*>(nullptr), dprobs_all.data()}) {
        std::vector<float> dl(N * E), cpu_dl(N * E);
        for (int64_t t = 0; t < N; ++t) {
          cuda_rows::router_token_backward(dl.data(), dweight.data(), all, cpu_probs.data(),
                                           cpu_idx.data(), E, k, norm, t);
        }
        router_topk_backward(cpu_dl.data(), dweight.data(), all, cpu_probs.data(), cpu_idx.data(),
                             N, E, k, norm);
        EXPECT_TRUE(same_bits(dl.data(), cpu_dl.data(), dl.size() * sizeof(float))) << name;
      }
    }
  }
}

// Dispatch's plan, gathers and sums, and combine: the CPU ops' bits (integers, copies, roundings
// and fp32 adds in the CPU's order); the combine's weighted sum is fmaf in ascending expert order,
// the CPU's where its vector ISA fuses (else within the fp32 bound of k products).
TEST(CudaRows, DispatchAndCombineAreTheCpuOpsBits) {
  for (const auto& [N, E, k, h] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{23, 7, 3, 19},
                                   {1, 4, 4, 5},
                                   {40, 16, 2, 33}}) {
    const ExpertsShape shape{N, h, 1, E, k};
    const int64_t R = shape.rows();
    const std::vector<int32_t> index = routed_experts(N, E, k, 70 + static_cast<uint64_t>(N));
    std::vector<int32_t> row_of(R), offsets(E + 1), cpu_row_of(R), cpu_offsets(E + 1);
    for (int64_t e = 0; e < E; ++e) cuda_rows::count_expert(offsets.data(), index.data(), R, e);
    cuda_rows::prefix_offsets(offsets.data(), E);
    for (int64_t e = 0; e < E; ++e) {
      cuda_rows::place_expert(row_of.data(), offsets.data(), index.data(), R, e);
    }
    moe_dispatch_plan(cpu_row_of.data(), cpu_offsets.data(), index.data(), shape);
    EXPECT_EQ(row_of, cpu_row_of);
    EXPECT_EQ(offsets, cpu_offsets);

    const std::vector<float> x = randn(N * h, 71), rows_in = randn(R * h, 72),
                             dweight_rows = randn(R, 73), weight = randn(N * k, 74),
                             dy = randn(N * h, 75);
    std::vector<float> x_rows(R * h), cpu_x_rows(R * h);
    std::vector<uint16_t> x16(R * h), cpu_x16(R * h);
    for (int64_t i = 0; i < R * h; ++i) {
      cuda_rows::gather_row_element(x_rows.data(), x.data(), row_of.data(), k, h, i);
      cuda_rows::gather_row_element_bf16(x16.data(), x.data(), row_of.data(), k, h, i);
    }
    moe_dispatch_forward(cpu_x_rows.data(), x.data(), row_of.data(), shape);
    moe_dispatch_forward_bf16(cpu_x16.data(), x.data(), row_of.data(), shape);
    EXPECT_EQ(x_rows, cpu_x_rows);
    EXPECT_EQ(x16, cpu_x16);

    std::vector<float> dx(N * h), cpu_dx(N * h), dweight(R), cpu_dweight(R);
    for (int64_t i = 0; i < N * h; ++i) {
      cuda_rows::sum_token_rows_element(dx.data(), rows_in.data(), row_of.data(), k, h, i);
    }
    for (int64_t p = 0; p < R; ++p) dweight[p] = dweight_rows[row_of[p]];  // the kernel's permute
    moe_dispatch_backward(cpu_dx.data(), cpu_dweight.data(), rows_in.data(), dweight_rows.data(),
                          row_of.data(), shape);
    EXPECT_TRUE(same_bits(dx.data(), cpu_dx.data(), dx.size() * sizeof(float)));
    EXPECT_EQ(dweight, cpu_dweight);

    std::vector<float> y(N * h), cpu_y(N * h);
    for (int64_t i = 0; i < N * h; ++i) {
      cuda_rows::combine_element(y.data(), rows_in.data(), row_of.data(), index.data(),
                                 weight.data(), k, h, i);
    }
    moe_combine_forward(cpu_y.data(), rows_in.data(), row_of.data(), index.data(), weight.data(),
                        shape);
    if (active_isa() != Isa::scalar) {
      EXPECT_TRUE(same_bits(y.data(), cpu_y.data(), y.size() * sizeof(float)));
    } else {
      expect_close("combine (scalar ISA: unfused)", y.data(), cpu_y.data(), N * h,
                   sum_tolerance(k));
    }
    std::vector<float> dy_rows(R * h), cpu_dy_rows(R * h), w_rows(R), cpu_w_rows(R);
    for (int64_t i = 0; i < R * h; ++i) {
      cuda_rows::gather_row_element(dy_rows.data(), dy.data(), row_of.data(), k, h, i);
    }
    for (int64_t p = 0; p < R; ++p) w_rows[row_of[p]] = weight[p];  // the kernel's permute
    moe_combine_backward(cpu_dy_rows.data(), cpu_w_rows.data(), dy.data(), weight.data(),
                         row_of.data(), shape);
    EXPECT_EQ(dy_rows, cpu_dy_rows);
    EXPECT_EQ(w_rows, cpu_w_rows);
  }
}

// The grouped experts' row steps against the CPU's per-row arithmetic (ops/moe_experts.cpp): the
// scalings and the bf16 rounding of w * dy are single products, the same bits; the d weights are
// dot products whose sums the CPU takes in vector lanes, within the fp32 bound of their length;
// the bf16 SwiGLU keeps the CPU's gate and up roundings, and its act may land one bf16 ulp apart
// (expf against the CPU's exp approximation): 2^-7 of the largest, normwise.
TEST(CudaRows, GroupedExpertsRowStepsMatchTheCpu) {
  const int64_t R = 9, Im = 37, h = 21;
  const VecKernels& v = backend().vec();
  const std::vector<float> dact0 = randn(R * Im, 80), act = randn(R * Im, 81),
                           rows0 = randn(R * h, 82), w_rows = randn(R, 83), out = randn(R * h, 84);
  std::vector<float> cpu_dact = dact0, cpu_rows = rows0, cpu_dw(R), cpu_dot(R);
  for (int64_t r = 0; r < R; ++r) {
    cpu_dw[r] = v.dot(cpu_dact.data() + r * Im, act.data() + r * Im, Im);
    v.scale(cpu_dact.data() + r * Im, w_rows[r], Im);
    v.scale(cpu_rows.data() + r * h, w_rows[r], h);
    cpu_dot[r] = v.dot(rows0.data() + r * h, out.data() + r * h, h);
  }
  for (const int size : kTeamSizes) {
    const std::string team = " (team of " + std::to_string(size) + ")";
    std::vector<float> dact = dact0, rows = rows0, dw(R), dot(R);
    run_blocks(size, R, 0, [&](const auto& tm, float*, int64_t r) {
      cuda_rows::experts_row_weight_grad(tm, dw.data() + r, dact.data() + r * Im,
                                         act.data() + r * Im, rows.data() + r * h, w_rows[r], Im,
                                         h);
    });
    run_blocks(size, R, 0, [&](const auto& tm, float*, int64_t r) {
      cuda_rows::experts_row_dot(tm, dot.data() + r, rows0.data() + r * h, out.data() + r * h, h);
    });
    EXPECT_EQ(dact, cpu_dact) << team;
    EXPECT_EQ(rows, cpu_rows) << team;
    expect_close("experts d weight (fp32)" + team, dw.data(), cpu_dw.data(), R, sum_tolerance(Im));
    expect_close("experts d weight (bf16)" + team, dot.data(), cpu_dot.data(), R, sum_tolerance(h));
  }
  std::vector<uint16_t> scaled(R * h), cpu_scaled(R * h);
  for (int64_t i = 0; i < R * h; ++i) {
    cuda_rows::scaled_row_element_bf16(scaled.data(), rows0.data(), w_rows.data(), h, i);
  }
  for (int64_t r = 0; r < R; ++r) {
    v.round_to_bf16(cpu_scaled.data() + r * h, rows0.data() + r * h, w_rows[r], h);
  }
  EXPECT_EQ(scaled, cpu_scaled);

  const int64_t n = R * Im;
  const std::vector<float> gate = randn(n, 85, 3.0f), up = randn(n, 86);
  std::vector<uint16_t> act16(n), g16(n), u16(n), cpu_act16(n), cpu_g16(n), cpu_u16(n);
  for (int64_t i = 0; i < n; ++i) {
    cuda_rows::swiglu_forward_bf16_element(act16.data(), g16.data(), u16.data(), gate.data(),
                                           up.data(), i);
  }
  swiglu_forward_bf16(cpu_act16.data(), cpu_g16.data(), cpu_u16.data(), gate.data(), up.data(), n);
  EXPECT_EQ(g16, cpu_g16);
  EXPECT_EQ(u16, cpu_u16);
  std::vector<float> act_f(n), cpu_act_f(n);
  for (int64_t i = 0; i < n; ++i) {
    act_f[i] = bf16_to_f32(act16[i]);
    cpu_act_f[i] = bf16_to_f32(cpu_act16[i]);
  }
  expect_close("experts swiglu_forward_bf16", act_f.data(), cpu_act_f.data(), n,
               std::ldexp(1.0, -7));
}

// The load-balancing statistics onto running totals: the CPU's adds in its order, the same bits.
TEST(CudaRows, LoadBalancingStatisticsAreTheCpuOpsBits) {
  const int64_t N = 29, E = 6, k = 2;
  const std::vector<int32_t> index = routed_experts(N, E, k, 90);
  const std::vector<float> probs = randn(N * E, 91, 0.3f);
  std::vector<double> counts(E), sums(E);
  for (int64_t e = 0; e < E; ++e) {
    counts[e] = static_cast<double>(e + 3);
    sums[e] = 0.1 * static_cast<double>(e) + 0.0123;
  }
  std::vector<double> cpu_counts = counts, cpu_sums = sums;
  for (int64_t e = 0; e < E; ++e) {
    cuda_rows::load_balancing_expert(counts.data(), sums.data(), probs.data(), index.data(), N, E,
                                     k, e);
  }
  load_balancing_accumulate(cpu_counts.data(), cpu_sums.data(), probs.data(), index.data(), N, E,
                            k);
  EXPECT_EQ(counts, cpu_counts);
  EXPECT_TRUE(same_bits(sums.data(), cpu_sums.data(), sums.size() * sizeof(double)));
}

}  // namespace
}  // namespace titan
