#include "titan/dispatch/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/ops/embedding.h"
#include "titan/ops/linear.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/swiglu.h"

namespace titan {
namespace {

using namespace verify_checks;

void verify_embedding(const EmbeddingKernel& k, Checks& c) {
  const int64_t vocab = 50, dim = 64, n = 96;
  const std::vector<float> weight = uniform(vocab * dim, 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  Rng rng(2, "verify-kernels ids");
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.next_u64() % vocab);
  // The lookup is a copy: the reference is the rows themselves.
  std::vector<float> want(static_cast<size_t>(n * dim)), got(want.size());
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(weight.begin() + ids[t] * dim, dim, want.begin() + t * dim);
  }
  k.forward(got.data(), ids.data(), weight.data(), n, vocab, dim);
  c.add("forward", "out", got, want, 0.0);
  if (k.forward_bf16 != nullptr) {
    const std::vector<uint16_t> weight16 = rounded(weight);
    const std::vector<float> grid = widened(weight16);
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(grid.begin() + ids[t] * dim, dim, want.begin() + t * dim);
    }
    k.forward_bf16(got.data(), ids.data(), weight16.data(), n, vocab, dim);
    c.add("forward_bf16", "out", got, want, 0.0);
  }
  // dweight += scatter of dout: fp64 sums per row, from a nonzero start.
  const std::vector<float> dout = uniform(n * dim, 3), start = uniform(vocab * dim, 4);
  std::vector<double> sums(start.begin(), start.end());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < dim; ++j) sums[ids[t] * dim + j] += dout[t * dim + j];
  }
  std::vector<float> dweight = start;
  k.backward(dweight.data(), dout.data(), ids.data(), n, dim);
  c.add("backward", "dweight", dweight, std::vector<float>(sums.begin(), sums.end()),
        fp32_tolerance(n));
  if (k.forward_vocab_parallel != nullptr) verify_embedding_vocab_parallel(k, c);
}

void verify_rms_norm(const RmsNormKernel& k, Checks& c) {
  const int64_t rows = 37, dim = 96;
  const float eps = 1e-6f;
  const std::vector<float> x = uniform(rows * dim, 1), weight = uniform(dim, 2, 0.5f, 1.5f);
  std::vector<float> out(x.size()), rstd(rows), want(x.size()), want_rstd(rows);
  k.forward(out.data(), rstd.data(), x.data(), weight.data(), rows, dim, eps);
  rms_norm_forward_reference(want.data(), want_rstd.data(), x.data(), weight.data(), rows, dim,
                             eps);
  c.add("forward", "out", out, want, fp32_tolerance(dim));
  c.add("forward", "rstd", rstd, want_rstd, fp32_tolerance(dim));
  const std::vector<float> dout = uniform(rows * dim, 3), dweight0 = uniform(dim, 4);
  std::vector<float> dx(x.size()), dweight = dweight0, want_dx(x.size()), want_dweight = dweight0;
  k.backward(dx.data(), dweight.data(), dout.data(), x.data(), weight.data(), want_rstd.data(),
             rows, dim);
  rms_norm_backward_reference(want_dx.data(), want_dweight.data(), dout.data(), x.data(),
                              weight.data(), want_rstd.data(), rows, dim);
  c.add("backward", "dx", dx, want_dx, fp32_tolerance(dim));
  c.add("backward", "dweight", dweight, want_dweight, fp32_tolerance(rows));
}

void verify_linear(const LinearKernel& k, Checks& c) {
  const int64_t n = 33, in = 80, out = 48;
  const std::vector<float> x = uniform(n * in, 1), w = uniform(out * in, 2),
                           dy = uniform(n * out, 3), dx0 = uniform(n * in, 4),
                           dw0 = uniform(out * in, 5);
  const int64_t terms = std::max({in, out, n});
  std::vector<float> y(static_cast<size_t>(n * out)), want_y(y.size());
  k.forward(y.data(), x.data(), w.data(), n, in, out);
  linear_forward_reference(want_y.data(), x.data(), w.data(), n, in, out);
  c.add("forward", "y", y, want_y, fp32_tolerance(in));
  for (const bool accumulate : {false, true}) {
    std::vector<float> dx = dx0, dw = dw0, want_dx = dx0, want_dw = dw0;
    k.backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), n, in, out, accumulate);
    linear_backward_reference(want_dx.data(), want_dw.data(), dy.data(), x.data(), w.data(), n, in,
                              out, accumulate);
    const std::string form = accumulate ? "backward (dx accumulated)" : "backward";
    c.add(form, "dx", dx, want_dx, fp32_tolerance(terms));
    c.add(form, "dweight", dw, want_dw, fp32_tolerance(terms));
  }
  if (k.forward_bf16 == nullptr) return;
  // bf16 operands: the reference takes the same bf16 values, so only fp32 accumulation differs.
  const std::vector<uint16_t> x16 = rounded(x), w16 = rounded(w), dy16 = rounded(dy);
  k.forward_bf16(y.data(), x16.data(), w16.data(), n, in, out);
  linear_forward_bf16_reference(want_y.data(), x16.data(), w16.data(), n, in, out);
  c.add("forward_bf16", "y", y, want_y, fp32_tolerance(in));
  std::vector<float> dx = dx0, dw = dw0, want_dx = dx0, want_dw = dw0;
  k.backward_bf16(dx.data(), dw.data(), dy16.data(), x16.data(), w16.data(), n, in, out, false);
  linear_backward_bf16_reference(want_dx.data(), want_dw.data(), dy16.data(), x16.data(),
                                 w16.data(), n, in, out, false);
  c.add("backward_bf16", "dx", dx, want_dx, fp32_tolerance(terms));
  c.add("backward_bf16", "dweight", dw, want_dw, fp32_tolerance(terms));
  if (k.forward_bf16_to_bf16 != nullptr) {
    std::vector<uint16_t> y16(y.size());
    k.forward_bf16_to_bf16(y16.data(), x16.data(), w16.data(), n, in, out);
    c.add_bf16("forward_bf16_to_bf16", "y", y16, want_y);
  }
}

void verify_rope(const RopeKernel& k, Checks& c) {
  const int64_t n = 19, heads = 3, max_positions = 600;
  RopeParams params;
  params.head_dim = 32;
  params.theta = 10000.0;
  const RopeCache cache = rope_cache_build(params, max_positions);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  Rng rng(1, "verify-kernels positions");
  for (int32_t& p : positions) p = static_cast<int32_t>(rng.next_u64() % max_positions);
  const std::vector<float> x = uniform(n * heads * params.head_dim, 2);
  // The kernel reads cos and sin from the cache HF builds in fp32 (pos x inv_freq rounded once);
  // the reference recomputes them in fp64: they differ by up to pos x 2^-24 radians.
  const double tolerance = fp32_tolerance(max_positions);
  std::vector<float> got = x, want = x;
  k.forward(got.data(), positions.data(), cache, n, heads);
  rope_forward_reference(want.data(), positions.data(), params, n, heads);
  c.add("forward", "x", got, want, tolerance);
  // The backward is the transposed rotation, R(pos)^T = R(-pos).
  std::vector<int32_t> negated(positions.size());
  std::transform(positions.begin(), positions.end(), negated.begin(), [](int32_t p) { return -p; });
  got = x, want = x;
  k.backward(got.data(), positions.data(), cache, n, heads);
  rope_forward_reference(want.data(), negated.data(), params, n, heads);
  c.add("backward", "dx", got, want, tolerance);
}

void verify_swiglu(const SwigluKernel& k, Checks& c) {
  const int64_t n = 1000;
  const std::vector<float> gate = uniform(n, 1, -4.0f, 4.0f), up = uniform(n, 2),
                           dout = uniform(n, 3);
  // silu's exp is good to about 1 ulp; each output is a few fp32 operations.
  const double tolerance = fp32_tolerance(4);
  std::vector<float> out(n), want(n);
  k.forward(out.data(), gate.data(), up.data(), n);
  swiglu_forward_reference(want.data(), gate.data(), up.data(), n);
  c.add("forward", "out", out, want, tolerance);
  std::vector<float> dgate(n), dup(n), want_dgate(n), want_dup(n);
  k.backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  swiglu_backward_reference(want_dgate.data(), want_dup.data(), dout.data(), gate.data(), up.data(),
                            n);
  c.add("backward", "dgate", dgate, want_dgate, tolerance);
  c.add("backward", "dup", dup, want_dup, tolerance);
  if (k.recompute_bf16 == nullptr) return;
  // Mixed precision's forms take the kept bf16 gate and up; the reference takes their values.
  const std::vector<uint16_t> gate16 = rounded(gate), up16 = rounded(up);
  const std::vector<float> gate_grid = widened(gate16), up_grid = widened(up16);
  std::vector<uint16_t> act16(n), dgate16(n), dup16(n);
  k.recompute_bf16(act16.data(), gate16.data(), up16.data(), n);
  swiglu_forward_reference(want.data(), gate_grid.data(), up_grid.data(), n);
  c.add_bf16("recompute_bf16", "act", act16, want);
  k.backward_bf16(dgate16.data(), dup16.data(), dout.data(), gate16.data(), up16.data(), n);
  swiglu_backward_reference(want_dgate.data(), want_dup.data(), dout.data(), gate_grid.data(),
                            up_grid.data(), n);
  c.add_bf16("backward_bf16", "dgate", dgate16, want_dgate);
  c.add_bf16("backward_bf16", "dup", dup16, want_dup);
}

// The kernel's fp32 forward and backward on random inputs (seeds seed..seed + 3) against the
// op's reference, as the checks `forward` and `backward`; the inputs are returned.
struct AttentionInputs {
  std::vector<float> q, key, v, dout;
};
AttentionInputs check_attention_fp32(const AttentionKernel& k, const AttentionShape& s,
                                     uint64_t seed, const char* forward, const char* backward,
                                     Checks& c) {
  const int64_t q_numel = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t kv_numel = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  const int64_t lse_numel = s.batch * s.n_heads * s.seq_q;
  AttentionInputs in{uniform(q_numel, seed), uniform(kv_numel, seed + 1),
                     uniform(kv_numel, seed + 2), uniform(q_numel, seed + 3)};
  const double tolerance = fp32_tolerance(std::max(s.seq_kv, s.head_dim));
  std::vector<float> out(q_numel), lse(lse_numel), want(q_numel), want_lse(lse_numel);
  k.forward(out.data(), lse.data(), in.q.data(), in.key.data(), in.v.data(), s);
  attention_forward_reference(want.data(), want_lse.data(), in.q.data(), in.key.data(), in.v.data(),
                              s);
  c.add(forward, "out", out, want, tolerance);
  c.add(forward, "lse", lse, want_lse, tolerance);
  std::vector<float> dq(q_numel), dk(kv_numel), dv(kv_numel), want_dq(q_numel), want_dk(kv_numel),
      want_dv(kv_numel);
  k.backward(dq.data(), dk.data(), dv.data(), in.dout.data(), in.q.data(), in.key.data(),
             in.v.data(), want.data(), want_lse.data(), s);
  attention_backward_reference(want_dq.data(), want_dk.data(), want_dv.data(), in.dout.data(),
                               in.q.data(), in.key.data(), in.v.data(), want.data(),
                               want_lse.data(), s);
  c.add(backward, "dq", dq, want_dq, tolerance);
  c.add(backward, "dk", dk, want_dk, tolerance);
  c.add(backward, "dv", dv, want_dv, tolerance);
  return in;
}

// A kernel that declares packed rows: sequences of 60, 1 and 109 tokens in each of two rows of
// 170 (across a 128-key block), its fp32 forward and backward against the segment-aware reference.
void verify_attention_packed(const AttentionKernel& k, Checks& c) {
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 170; ++i) starts.push_back(i < 60 ? 0 : i < 61 ? 60 : 61);
  }
  AttentionShape s;
  s.batch = 2, s.seq_q = 170, s.seq_kv = 170, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 32;
  s.segment_start = starts.data();
  check_attention_fp32(k, s, 5, "forward_packed", "backward_packed", c);
}

void verify_attention(const AttentionKernel& k, Checks& c) {
  // Positions past one 128-key block, grouped heads, a batch of two; queries the last 150 of
  // 170 positions, as a prefill after a cached prefix has them.
  AttentionShape s;
  s.batch = 2, s.seq_q = 150, s.seq_kv = 170, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 32;
  if (k.check) {
    const std::string violated = k.check(s);
    TITAN_CHECK(violated.empty(),
                "the attention check's shape breaks the kernel's constraint: ", violated);
  }
  const AttentionInputs in = check_attention_fp32(k, s, 1, "forward", "backward", c);
  const std::vector<float>&q = in.q, &key = in.key, &v = in.v, &dout = in.dout;
  const int64_t q_numel = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t kv_numel = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  const int64_t lse_numel = s.batch * s.n_heads * s.seq_q;
  const double tolerance = fp32_tolerance(std::max(s.seq_kv, s.head_dim));
  std::vector<float> out(q_numel), lse(lse_numel), want(q_numel), want_lse(lse_numel);
  std::vector<float> dq(q_numel), dk(kv_numel), dv(kv_numel), want_dq(q_numel), want_dk(kv_numel),
      want_dv(kv_numel);
  const std::vector<uint16_t> q16 = rounded(q), k16 = rounded(key), v16 = rounded(v);
  const std::vector<float> q_grid = widened(q16), k_grid = widened(k16), v_grid = widened(v16);
  if (k.forward_bf16_kv != nullptr) {
    // Keys and values widened exactly as read: the reference on the same values.
    k.forward_bf16_kv(out.data(), lse.data(), q.data(), k16.data(), v16.data(), s);
    attention_forward_reference_bf16_kv(want.data(), want_lse.data(), q.data(), k16.data(),
                                        v16.data(), s);
    c.add("forward_bf16_kv", "out", out, want, tolerance);
    c.add("forward_bf16_kv", "lse", lse, want_lse, tolerance);
  }
  // bf16 GEMMs round the probabilities (and in the backward dout and dS): against the fp32
  // reference on the bf16 inputs' values.
  attention_forward_reference(want.data(), want_lse.data(), q_grid.data(), k_grid.data(),
                              v_grid.data(), s);
  if (k.forward_bf16 != nullptr) {
    k.forward_bf16(out.data(), lse.data(), q16.data(), k16.data(), v16.data(), s);
    c.add("forward_bf16", "out", out, want, kBf16Tolerance);
    c.add("forward_bf16", "lse", lse, want_lse, kBf16Tolerance);
  }
  if (k.backward_bf16 != nullptr) {
    const std::vector<uint16_t> out16 = rounded(want);
    const std::vector<float> out_grid = widened(out16);
    k.backward_bf16(dq.data(), dk.data(), dv.data(), dout.data(), q16.data(), k16.data(),
                    v16.data(), out16.data(), want_lse.data(), s);
    attention_backward_reference(want_dq.data(), want_dk.data(), want_dv.data(), dout.data(),
                                 q_grid.data(), k_grid.data(), v_grid.data(), out_grid.data(),
                                 want_lse.data(), s);
    c.add("backward_bf16", "dq", dq, want_dq, kBf16Tolerance);
    c.add("backward_bf16", "dk", dk, want_dk, kBf16Tolerance);
    c.add("backward_bf16", "dv", dv, want_dv, kBf16Tolerance);
  }
  if (k.packed_rows) verify_attention_packed(k, c);
}

void verify_lm_head_loss(const LmHeadLossKernel& k, bool takes_bf16, Checks& c) {
  const LmHeadLossInputs in;
  const int64_t n = in.n, hidden = in.hidden, vocab = in.vocab;
  const auto run = [&](const LmHeadLossKernel& kernel, const float* x_in, const float* w_in,
                       const uint16_t* w16, std::vector<float>& dx, std::vector<float>& dweight) {
    std::vector<uint16_t> x16(w16 != nullptr ? static_cast<size_t>(n * hidden) : 0);
    CrossEntropyArgs a;
    a.x = x_in, a.weight = w_in, a.weight_bf16 = w16, a.x_bf16 = w16 ? x16.data() : nullptr;
    a.targets = in.targets.data(), a.n_tokens = n, a.hidden = hidden, a.vocab = vocab;
    dx.assign(static_cast<size_t>(n * hidden), 0.0f);
    dweight = in.dweight0;
    a.dx = dx.data(), a.dweight = dweight.data(), a.grad_scale = 1.0f / (n - 1);
    a.chunk_tokens = 7;  // several chunks, the last one short
    return static_cast<float>(kernel.forward_backward(a).loss_sum);
  };
  const LmHeadLossKernel reference{lm_head_cross_entropy_reference};
  std::vector<float> dx, dweight, want_dx, want_dweight;
  const float loss = run(k, in.x.data(), in.weight.data(), nullptr, dx, dweight);
  const float want_loss =
      run(reference, in.x.data(), in.weight.data(), nullptr, want_dx, want_dweight);
  const double tolerance = fp32_tolerance(std::max({vocab, hidden, n}));
  add_lm_head_loss_checks(c, "forward_backward", {loss}, want_loss, dx, want_dx, dweight,
                          want_dweight, tolerance);
  if (takes_bf16) {
    // bf16 GEMMs and logits: against the reference on the bf16 operands' values.
    const std::vector<uint16_t> weight16 = rounded(in.weight);
    const std::vector<float> x_grid = on_bf16_grid(in.x), w_grid = widened(weight16);
    const float loss16 = run(k, in.x.data(), in.weight.data(), weight16.data(), dx, dweight);
    const float want16 =
        run(reference, x_grid.data(), w_grid.data(), nullptr, want_dx, want_dweight);
    add_lm_head_loss_checks(c, "forward_backward_bf16", {loss16}, want16, dx, want_dx, dweight,
                            want_dweight, kBf16Tolerance);
  }
  if (k.forward_backward_vocab_parallel != nullptr) {
    verify_lm_head_loss_vocab_parallel(k, takes_bf16, c);
  }
}

}  // namespace

bool KernelReport::passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const KernelCheck& c) { return c.passed(); });
}

KernelReport verify_kernel(const KernelEntry& entry) {
  // Its inputs here are host memory; a device's kernels are checked on the device
  // (titan_cuda_kernels_test for CUDA's).
  TITAN_CHECK(entry.device == DeviceKind::cpu, "kernel '", entry.name, "' runs on ",
              device_kind_name(entry.device),
              ": verify-kernels checks the kernels that run on the CPU");
  KernelReport report;
  report.kernel = entry.name;
  report.kind = entry.kind;
  Checks checks(report);
  const bool takes_bf16 =
      std::find(entry.dtypes.begin(), entry.dtypes.end(), DType::bf16) != entry.dtypes.end();
  try {
    std::visit(
        [&](const auto& kernel) {
          using K = std::decay_t<decltype(kernel)>;
          if constexpr (std::is_same_v<K, EmbeddingKernel>) verify_embedding(kernel, checks);
          if constexpr (std::is_same_v<K, RmsNormKernel>) verify_rms_norm(kernel, checks);
          if constexpr (std::is_same_v<K, LinearKernel>) verify_linear(kernel, checks);
          if constexpr (std::is_same_v<K, RopeKernel>) verify_rope(kernel, checks);
          if constexpr (std::is_same_v<K, AttentionKernel>) verify_attention(kernel, checks);
          if constexpr (std::is_same_v<K, SwigluKernel>) verify_swiglu(kernel, checks);
          if constexpr (std::is_same_v<K, LmHeadLossKernel>) {
            verify_lm_head_loss(kernel, takes_bf16, checks);
          }
          if constexpr (std::is_same_v<K, ExpertsKernel>) verify_experts(kernel, checks);
          if constexpr (std::is_same_v<K, RouterKernel>) verify_router(kernel, checks);
          if constexpr (std::is_same_v<K, MoeDispatchKernel>) verify_moe_dispatch(kernel, checks);
          if constexpr (std::is_same_v<K, GroupedExpertsKernel>) {
            verify_grouped_experts(kernel, checks);
          }
          if constexpr (std::is_same_v<K, MoeCombineKernel>) verify_moe_combine(kernel, checks);
        },
        entry.impl);
  } catch (const Error& e) {
    fail("kernel '", entry.name, "' (", op_kind_name(entry.kind),
         ") failed on its check inputs: ", e.what());
  }
  return report;
}

}  // namespace titan
