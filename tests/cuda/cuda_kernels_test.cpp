// Every CUDA kernel registered for DeviceKind::cuda (dispatch/cuda/cuda_kernels.cpp), reached
// through the registry as a model reaches it, against the fp32 reference of its op (the
// *_reference functions of src/titan/ops, fp64 sums) on odd shapes: rows and lengths no tile or
// block divides, GQA ratios 1, 2 and 8, head dims 64 and 128. Written 2026-12-06 on a machine
// without a GPU: it compiled there and has not run on one yet. With no GPU (or no driver) it
// prints the one line "no CUDA device (...)" and exits 1, as titan_cuda_smoke does.
//
// Tolerances are normwise (max |got - ref| / max |ref|). An fp32 sum of n terms errs by at most
// about n * 2^-24 of the sum of magnitudes; each check allows kSlack times that for its longest sum
// (a row's length, a dot product's, a GEMM's k), plus a few ulps for expf/logf/sqrtf. bf16 outputs
// (rounded once from a value the kernel computes in fp32) may land one bf16 ulp from the
// reference's rounding: at most 2^-7 of that element (8 significant bits), so of the largest. Exact
// operations (gathers, casts, copies) must be bit-equal. The bf16 forms of attention and the loss
// (mixed-precision training's rounding points) are checked against the CPU's own bf16 forms, run
// on the CPU before CUDA becomes the ops' backend, element by element within one bf16 rounding
// step of the sum of each output's products' magnitudes (unit/attention_bf16_bounds.h).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/backend/device_buffer.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/device_ops.h"
#include "titan/dispatch/registry.h"
#include "titan/ops/adamw.h"
#include "titan/ops/attention.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/bias.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/embedding.h"
#include "titan/ops/gemv.h"
#include "titan/ops/linear.h"
#include "titan/ops/lora_dropout.h"
#include "titan/ops/moe.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/rope.h"
#include "titan/ops/swiglu.h"
#include "unit/attention_bf16_bounds.h"

namespace titan {
namespace {

constexpr double kSlack = 4.0;
double sum_tolerance(int64_t longest_sum) {
  return kSlack * static_cast<double>(longest_sum + 8) * std::ldexp(1.0, -24);
}
const double kBf16Tolerance = std::ldexp(1.0, -7);

int g_failures = 0;

void check(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
           double tolerance) {
  double max_abs = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff =
        std::isfinite(got[i]) ? std::fabs(static_cast<double>(got[i]) - want[i]) : INFINITY;
    max_abs = std::max(max_abs, diff);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  const double error = max_abs / std::max(max_ref, 1e-30);
  const bool ok = got.size() == want.size() && error <= tolerance;
  std::printf("%-64s %10.2e %10.2e  %s\n", what.c_str(), error, tolerance, ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
}

void check_true(const std::string& what, bool ok) {
  std::printf("%-64s %21s  %s\n", what.c_str(), "", ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
}

// The message `call` throws, or "" when it does not.
template <typename F>
std::string error_of(F call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> randn(int64_t n, uint64_t seed, float std = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng(seed).fill_normal(v.data(), n, 0.0f, std);
  return v;
}

template <typename T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  if constexpr (std::is_same_v<T, uint16_t>) return DType::bf16;
  if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
}

template <typename T>
DeviceBuffer up(const std::vector<T>& host) {
  DeviceBuffer buf(backend(), static_cast<int64_t>(host.size()), dtype_of<T>(), MemCategory::other);
  copy_from_host(buf, host.data(), dtype_of<T>(), static_cast<int64_t>(host.size()));
  return buf;
}

template <typename T = float>
std::vector<T> down(const DeviceBuffer& buf) {
  std::vector<T> host(static_cast<size_t>(buf.numel()));
  copy_to_host(host.data(), dtype_of<T>(), buf.numel(), buf);
  return host;
}

std::vector<float> widen(const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_f32(bits[i]);
  return f;
}

std::vector<uint16_t> round(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  return bits;
}

template <typename Kernel>
const Kernel& cuda_kernel(const char* name, OpKind kind) {
  const KernelEntry& entry = kernel_registry().get(name, kind);
  TITAN_CHECK(entry.device == DeviceKind::cuda, name, " is not a CUDA kernel");
  return std::get<Kernel>(entry.impl);
}

void test_rms_norm() {
  const RmsNormKernel& k = cuda_kernel<RmsNormKernel>("rms_norm_cuda", OpKind::rms_norm);
  // A hidden size no block divides; a q/k norm's rows (tokens x heads) of head_dim 128.
  for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{300, 1000}, {37 * 8, 128}}) {
    const std::vector<float> x = randn(rows * dim, 1), w = randn(dim, 2),
                             dout = randn(rows * dim, 3);
    std::vector<float> ref_out(x.size()), ref_rstd(rows), ref_dx(x.size()), ref_dw(dim, 0.5f);
    rms_norm_forward_reference(ref_out.data(), ref_rstd.data(), x.data(), w.data(), rows, dim,
                               1e-6f);
    rms_norm_backward_reference(ref_dx.data(), ref_dw.data(), dout.data(), x.data(), w.data(),
                                ref_rstd.data(), rows, dim);
    DeviceBuffer w_ = up(w), out(backend(), rows * dim, DType::f32, MemCategory::other),
                 rstd(backend(), rows, DType::f32, MemCategory::other);
    DeviceBuffer x_ = up(x), g = up(dout), dw = up(std::vector<float>(dim, 0.5f));
    k.forward(out.as<float>(), rstd.as<float>(), x_.as<float>(), w_.as<float>(), rows, dim, 1e-6f);
    // dx written over dout (the aliasing the contract allows).
    k.backward(g.as<float>(), dw.as<float>(), g.as<float>(), x_.as<float>(), w_.as<float>(),
               rstd.as<float>(), rows, dim);
    const std::string at = " (" + std::to_string(rows) + " x " + std::to_string(dim) + ")";
    check("rms_norm forward out" + at, down(out), ref_out, sum_tolerance(dim));
    check("rms_norm forward rstd" + at, down(rstd), ref_rstd, sum_tolerance(dim));
    check("rms_norm backward dx (over dout)" + at, down(g), ref_dx, sum_tolerance(dim));
    check("rms_norm backward dweight" + at, down(dw), ref_dw, sum_tolerance(rows));
  }
}

void test_rope() {
  const RopeKernel& k = cuda_kernel<RopeKernel>("rope_cuda", OpKind::rope);
  for (const int64_t hd : {int64_t{64}, int64_t{128}}) {
    RopeParams rope;
    rope.head_dim = hd;
    rope.theta = 500000.0;
    rope.scaling.type = "llama3";
    rope.scaling.factor = 8.0;
    rope.scaling.original_max_position_embeddings = 64;
    const int64_t n = 37, heads = 8, max_positions = 300;
    std::vector<int32_t> positions(n);
    for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>((t * 97) % max_positions);
    const std::vector<float> x = randn(n * heads * hd, 4);
    std::vector<float> want = x;
    rope_forward_reference(want.data(), positions.data(), rope, n, heads);
    const RopeCache cache =
        kernel_registry().device_ops(DeviceKind::cuda).rope_cache(rope, max_positions);
    const RopeCache host_cache = rope_cache_build(rope, max_positions);
    std::vector<float> table(host_cache.table.bytes() / sizeof(float));
    backend().copy_to_host(table.data(), cache.table.data(), cache.table.bytes());
    check("rope_cache table (hd " + std::to_string(hd) + ")", table,
          std::vector<float>(host_cache.cos(), host_cache.cos() + table.size()), 0.0);
    DeviceBuffer pos = up(positions), xd = up(x);
    k.forward(xd.as<float>(), pos.as<int32_t>(), cache, n, heads);
    check("rope forward (hd " + std::to_string(hd) + ")", down(xd), want, sum_tolerance(2));
    // The backward is the transpose rotation: it takes the forward's output back to x.
    k.backward(xd.as<float>(), pos.as<int32_t>(), cache, n, heads);
    check("rope backward undoes forward (hd " + std::to_string(hd) + ")", down(xd), x,
          sum_tolerance(4));
    std::vector<int32_t> bad = positions;
    bad[5] = static_cast<int32_t>(max_positions);
    DeviceBuffer bad_pos = up(bad);
    check_true("rope refuses position 300 at token 5 in one line",
               error_of([&] {
                 k.forward(xd.as<float>(), bad_pos.as<int32_t>(), cache, n, heads);
               }) == "position 300 at token 5 is outside the RoPE cache [0, 300)");
  }
}

void test_swiglu() {
  const SwigluKernel& k = cuda_kernel<SwigluKernel>("swiglu_cuda", OpKind::swiglu);
  const int64_t n = 100003;
  const std::vector<float> gate = randn(n, 5, 3.0f), upv = randn(n, 6), dout = randn(n, 7);
  std::vector<float> ref_out(n), ref_dgate(n), ref_dup(n);
  swiglu_forward_reference(ref_out.data(), gate.data(), upv.data(), n);
  swiglu_backward_reference(ref_dgate.data(), ref_dup.data(), dout.data(), gate.data(), upv.data(),
                            n);
  DeviceBuffer g = up(gate), u = up(upv), d = up(dout);
  DeviceBuffer out(backend(), n, DType::f32, MemCategory::other),
      dg(backend(), n, DType::f32, MemCategory::other),
      du(backend(), n, DType::f32, MemCategory::other);
  k.forward(out.as<float>(), g.as<float>(), u.as<float>(), n);
  k.backward(dg.as<float>(), du.as<float>(), d.as<float>(), g.as<float>(), u.as<float>(), n);
  check("swiglu forward", down(out), ref_out, sum_tolerance(4));
  check("swiglu backward dgate", down(dg), ref_dgate, sum_tolerance(8));
  check("swiglu backward dup", down(du), ref_dup, sum_tolerance(4));
  // bf16: the reference on the widened roundings, rounded once.
  const std::vector<uint16_t> g16 = round(gate), u16 = round(upv);
  std::vector<float> act_ref(n), dg_ref(n), du_ref(n);
  swiglu_forward_reference(act_ref.data(), widen(g16).data(), widen(u16).data(), n);
  swiglu_backward_reference(dg_ref.data(), du_ref.data(), dout.data(), widen(g16).data(),
                            widen(u16).data(), n);
  DeviceBuffer gb = up(g16), ub = up(u16);
  DeviceBuffer act(backend(), n, DType::bf16, MemCategory::other),
      dgb(backend(), n, DType::bf16, MemCategory::other),
      dub(backend(), n, DType::bf16, MemCategory::other);
  k.recompute_bf16(act.as<uint16_t>(), gb.as<uint16_t>(), ub.as<uint16_t>(), n);
  k.backward_bf16(dgb.as<uint16_t>(), dub.as<uint16_t>(), d.as<float>(), gb.as<uint16_t>(),
                  ub.as<uint16_t>(), n);
  check("swiglu recompute_bf16", widen(down<uint16_t>(act)), widen(round(act_ref)), kBf16Tolerance);
  check("swiglu backward_bf16 dgate", widen(down<uint16_t>(dgb)), widen(round(dg_ref)),
        kBf16Tolerance);
  check("swiglu backward_bf16 dup", widen(down<uint16_t>(dub)), widen(round(du_ref)),
        kBf16Tolerance);
}

void test_embedding() {
  const EmbeddingKernel& k = cuda_kernel<EmbeddingKernel>("embedding_cuda", OpKind::embedding);
  const int64_t vocab = 1000, dim = 300, n = 777;
  const std::vector<float> weight = randn(vocab * dim, 9), dout = randn(n * dim, 10);
  std::vector<int32_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>((t * t * 31) % vocab);  // repeats
  std::vector<float> ref(n * dim), ref_dw(vocab * dim, 0.25f);
  embedding_forward(ref.data(), ids.data(), weight.data(), n, vocab, dim);
  embedding_backward(ref_dw.data(), dout.data(), ids.data(), n, dim);
  DeviceBuffer w = up(weight), id = up(ids), g = up(dout),
               dw = up(std::vector<float>(vocab * dim, 0.25f));
  DeviceBuffer out(backend(), n * dim, DType::f32, MemCategory::other);
  k.forward(out.as<float>(), id.as<int32_t>(), w.as<float>(), n, vocab, dim);
  k.backward(dw.as<float>(), g.as<float>(), id.as<int32_t>(), n, dim);
  check("embedding forward", down(out), ref, 0.0);
  // bf16 rows widened exactly: the fp32 lookup of the widened weight.
  const std::vector<uint16_t> w16 = round(weight);
  std::vector<float> ref16(n * dim);
  embedding_forward(ref16.data(), ids.data(), widen(w16).data(), n, vocab, dim);
  DeviceBuffer wb = up(w16);
  k.forward_bf16(out.as<float>(), id.as<int32_t>(), wb.as<uint16_t>(), n, vocab, dim);
  check("embedding forward_bf16", down(out), ref16, 0.0);
  check("embedding backward dweight", down(dw), ref_dw, sum_tolerance(n));
  std::vector<int32_t> bad = ids;
  bad[123] = static_cast<int32_t>(vocab);
  DeviceBuffer bad_ids = up(bad);
  check_true("embedding forward refuses id 1000 at 123 in one line",
             error_of([&] {
               k.forward(out.as<float>(), bad_ids.as<int32_t>(), w.as<float>(), n, vocab, dim);
             }) == "token id 1000 at position 123 is outside the vocabulary [0, 1000)");
}

void test_attention() {
  const AttentionKernel& k =
      cuda_kernel<AttentionKernel>("attention_cuda_simple", OpKind::attention);
  struct Case {
    int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  };
  // 300 positions cross a 256-key tile with a remainder; ratios 1, 2, 8; head dims 64, 128; the
  // last queries of a longer cache.
  const Case cases[] = {{2, 300, 300, 8, 8, 64},
                        {1, 300, 300, 8, 4, 128},
                        {2, 131, 131, 8, 1, 64},
                        {1, 7, 300, 4, 2, 128}};
  for (const Case& c : cases) {
    AttentionShape s;
    s.batch = c.batch;
    s.seq_q = c.seq_q;
    s.seq_kv = c.seq_kv;
    s.n_heads = c.heads;
    s.n_kv_heads = c.kv_heads;
    s.head_dim = c.head_dim;
    const int64_t nq = c.batch * c.seq_q * c.heads * c.head_dim;
    const int64_t nkv = c.batch * c.seq_kv * c.kv_heads * c.head_dim;
    const int64_t n_lse = c.batch * c.heads * c.seq_q;
    const std::vector<float> q = randn(nq, 20), kk = randn(nkv, 21), v = randn(nkv, 22),
                             dout = randn(nq, 23);
    std::vector<float> ref_out(nq), ref_lse(n_lse), ref_dq(nq), ref_dk(nkv), ref_dv(nkv);
    attention_forward_reference(ref_out.data(), ref_lse.data(), q.data(), kk.data(), v.data(), s);
    attention_backward_reference(ref_dq.data(), ref_dk.data(), ref_dv.data(), dout.data(), q.data(),
                                 kk.data(), v.data(), ref_out.data(), ref_lse.data(), s);
    DeviceBuffer qd = up(q), kd = up(kk), vd = up(v), gd = up(dout);
    DeviceBuffer out(backend(), nq, DType::f32, MemCategory::other),
        lse(backend(), n_lse, DType::f32, MemCategory::other),
        dq(backend(), nq, DType::f32, MemCategory::other),
        dk(backend(), nkv, DType::f32, MemCategory::other),
        dv(backend(), nkv, DType::f32, MemCategory::other);
    TITAN_CHECK(k.check(s).empty(), "attention_cuda_simple refuses a test shape: ", k.check(s));
    k.forward(out.as<float>(), lse.as<float>(), qd.as<float>(), kd.as<float>(), vd.as<float>(), s);
    k.backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), gd.as<float>(), qd.as<float>(),
               kd.as<float>(), vd.as<float>(), out.as<float>(), lse.as<float>(), s);
    const std::string at = " (B " + std::to_string(c.batch) + " Sq " + std::to_string(c.seq_q) +
                           " Skv " + std::to_string(c.seq_kv) + " H/KV " + std::to_string(c.heads) +
                           "/" + std::to_string(c.kv_heads) + " hd " + std::to_string(c.head_dim) +
                           ")";
    // The longest sums: a dot product (hd) and a row of probabilities (Skv, x the group for dk).
    const double tol = sum_tolerance(c.head_dim + c.seq_kv * c.heads / c.kv_heads);
    check("attention out" + at, down(out), ref_out, tol);
    check("attention lse" + at, down(lse), ref_lse, tol);
    check("attention dq" + at, down(dq), ref_dq, tol);
    check("attention dk" + at, down(dk), ref_dk, tol);
    check("attention dv" + at, down(dv), ref_dv, tol);
  }
}

// max |got - want| - bound over the elements: each within its bound, or the first that is not.
void check_within(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& want, const std::vector<double>& bound) {
  double worst = 0.0;  // the largest |got - want| / bound
  bool ok = got.size() == want.size() && bound.size() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) {
    const double diff =
        std::isfinite(got[i]) ? std::fabs(static_cast<double>(got[i]) - want[i]) : INFINITY;
    worst = std::max(worst, diff / std::max(bound[i], 1e-30));
  }
  ok = ok && worst <= 1.0;
  std::printf("%-64s %10.2e %10.2e  %s\n", what.c_str(), worst, 1.0, ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
}

// The CPU's bf16 forms, computed before CUDA is selected (the CPU ops call the active backend).
struct AttentionBf16Case {
  AttentionShape shape;
  std::vector<uint16_t> q, k, v, out16;
  std::vector<float> dout, out, lse, dq, dk, dv;
};

std::vector<AttentionBf16Case> cpu_attention_bf16_cases() {
  struct Size {
    int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  };
  // As test_attention's: past the CPU's 128-key blocks, so its running max rescales.
  const Size sizes[] = {{2, 300, 300, 8, 8, 64},
                        {1, 300, 300, 8, 4, 128},
                        {2, 131, 131, 8, 1, 64},
                        {1, 7, 300, 4, 2, 128}};
  std::vector<AttentionBf16Case> cases;
  for (const Size& z : sizes) {
    AttentionBf16Case c;
    c.shape.batch = z.batch;
    c.shape.seq_q = z.seq_q;
    c.shape.seq_kv = z.seq_kv;
    c.shape.n_heads = z.heads;
    c.shape.n_kv_heads = z.kv_heads;
    c.shape.head_dim = z.head_dim;
    const int64_t nq = z.batch * z.seq_q * z.heads * z.head_dim;
    const int64_t nkv = z.batch * z.seq_kv * z.kv_heads * z.head_dim;
    const int64_t n_lse = z.batch * z.heads * z.seq_q;
    c.q = round(randn(nq, 50));
    c.k = round(randn(nkv, 51));
    c.v = round(randn(nkv, 52));
    c.dout = randn(nq, 53);
    c.out.resize(nq);
    c.lse.resize(n_lse);
    c.dq.resize(nq);
    c.dk.resize(nkv);
    c.dv.resize(nkv);
    attention_forward_blockwise_bf16(c.out.data(), c.lse.data(), c.q.data(), c.k.data(), c.v.data(),
                                     c.shape);
    c.out16 = round(c.out);
    attention_backward_blockwise_bf16(c.dq.data(), c.dk.data(), c.dv.data(), c.dout.data(),
                                      c.q.data(), c.k.data(), c.v.data(), c.out16.data(),
                                      c.lse.data(), c.shape);
    cases.push_back(std::move(c));
  }
  return cases;
}

void test_attention_bf16(const std::vector<AttentionBf16Case>& cases) {
  const AttentionKernel& k =
      cuda_kernel<AttentionKernel>("attention_cuda_simple", OpKind::attention);
  for (const AttentionBf16Case& c : cases) {
    const AttentionShape& s = c.shape;
    const int64_t nq = static_cast<int64_t>(c.q.size()), nkv = static_cast<int64_t>(c.k.size());
    DeviceBuffer qd = up(c.q), kd = up(c.k), vd = up(c.v), gd = up(c.dout), od16 = up(c.out16),
                 lsed = up(c.lse);
    DeviceBuffer out(backend(), nq, DType::f32, MemCategory::other),
        lse(backend(), static_cast<int64_t>(c.lse.size()), DType::f32, MemCategory::other),
        dq(backend(), nq, DType::f32, MemCategory::other),
        dk(backend(), nkv, DType::f32, MemCategory::other),
        dv(backend(), nkv, DType::f32, MemCategory::other);
    k.forward_bf16(out.as<float>(), lse.as<float>(), qd.as<uint16_t>(), kd.as<uint16_t>(),
                   vd.as<uint16_t>(), s);
    // The backward from the CPU's out and lse, so that it is checked alone.
    k.backward_bf16(dq.as<float>(), dk.as<float>(), dv.as<float>(), gd.as<float>(),
                    qd.as<uint16_t>(), kd.as<uint16_t>(), vd.as<uint16_t>(), od16.as<uint16_t>(),
                    lsed.as<float>(), s);
    const double tol = sum_tolerance(s.head_dim + s.seq_kv * s.n_heads / s.n_kv_heads);
    const test::AttentionBf16Bounds bound = test::attention_bf16_bounds(
        s, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), c.out16.data(), c.lse.data(), tol);
    const std::string at = " (B " + std::to_string(s.batch) + " Sq " + std::to_string(s.seq_q) +
                           " Skv " + std::to_string(s.seq_kv) + " H/KV " +
                           std::to_string(s.n_heads) + "/" + std::to_string(s.n_kv_heads) + " hd " +
                           std::to_string(s.head_dim) + ")";
    check_within("attention bf16 out / bound" + at, down(out), c.out, bound.out);
    check("attention bf16 lse" + at, down(lse), c.lse, tol);
    check_within("attention bf16 dq / bound" + at, down(dq), c.dq, bound.dq);
    check_within("attention bf16 dk / bound" + at, down(dk), c.dk, bound.dk);
    check_within("attention bf16 dv / bound" + at, down(dv), c.dv, bound.dv);
  }
}

// cuDNN's fused attention (attention_cuda_cudnn's bf16 forms) against the CPU's bf16 forms on the
// same cases. cuDNN rounds where the CPU's form does (P for P V and dv, dS for dq and dk, dout for
// the GEMMs), and beyond it: its delta = dout . out reads dout rounded to bf16 (a relative error of
// 2^-8 in that dot product, covered by computing the bounds with tol + 2^-8 in place of tol), and
// out, dq, dk and dv come back rounded to bf16, each within 2^-8 of its value: 2^-8 of
// (|want| + bound) on top. The square cases only: the fourth (7 queries of 300 keys) it refuses.
void test_attention_cudnn(const std::vector<AttentionBf16Case>& cases) {
  const AttentionKernel& k =
      cuda_kernel<AttentionKernel>("attention_cuda_cudnn", OpKind::attention);
  const double half_step = std::ldexp(1.0, -8);
  const auto widened = [&](const std::vector<double>& bound, const std::vector<float>& want) {
    std::vector<double> b(bound.size());
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = bound[i] + half_step * (std::fabs(want[i]) + bound[i]);
    return b;
  };
  for (const AttentionBf16Case& c : cases) {
    const AttentionShape& s = c.shape;
    if (s.seq_q != s.seq_kv) {  // a KV-cache step: the simple kernel's bf16 forward, bit for bit
      check_true("attention cudnn takes 7 queries of 300 keys", k.check(s).empty());
      const AttentionKernel& simple =
          cuda_kernel<AttentionKernel>("attention_cuda_simple", OpKind::attention);
      DeviceBuffer qd = up(c.q), kd = up(c.k), vd = up(c.v);
      const int64_t nq = static_cast<int64_t>(c.q.size());
      const auto lse_n = static_cast<int64_t>(c.lse.size());
      DeviceBuffer a(backend(), nq, DType::f32, MemCategory::other),
          b(backend(), nq, DType::f32, MemCategory::other),
          la(backend(), lse_n, DType::f32, MemCategory::other),
          lb(backend(), lse_n, DType::f32, MemCategory::other);
      k.forward_bf16(a.as<float>(), la.as<float>(), qd.as<uint16_t>(), kd.as<uint16_t>(),
                     vd.as<uint16_t>(), s);
      simple.forward_bf16(b.as<float>(), lb.as<float>(), qd.as<uint16_t>(), kd.as<uint16_t>(),
                          vd.as<uint16_t>(), s);
      check_true("attention cudnn on 7 queries of 300 keys is the simple kernel's",
                 down(a) == down(b) && down(la) == down(lb));
      continue;
    }
    const int64_t nq = static_cast<int64_t>(c.q.size()), nkv = static_cast<int64_t>(c.k.size());
    DeviceBuffer qd = up(c.q), kd = up(c.k), vd = up(c.v), gd = up(c.dout), od16 = up(c.out16),
                 lsed = up(c.lse);
    DeviceBuffer out(backend(), nq, DType::f32, MemCategory::other),
        lse(backend(), static_cast<int64_t>(c.lse.size()), DType::f32, MemCategory::other),
        dq(backend(), nq, DType::f32, MemCategory::other),
        dk(backend(), nkv, DType::f32, MemCategory::other),
        dv(backend(), nkv, DType::f32, MemCategory::other);
    TITAN_CHECK(k.check(s).empty(), "attention_cuda_cudnn refuses a test shape: ", k.check(s));
    k.forward_bf16(out.as<float>(), lse.as<float>(), qd.as<uint16_t>(), kd.as<uint16_t>(),
                   vd.as<uint16_t>(), s);
    const std::vector<float> out_first = down(out);
    // The second call runs the cached graph: the same bits.
    k.forward_bf16(out.as<float>(), lse.as<float>(), qd.as<uint16_t>(), kd.as<uint16_t>(),
                   vd.as<uint16_t>(), s);
    k.backward_bf16(dq.as<float>(), dk.as<float>(), dv.as<float>(), gd.as<float>(),
                    qd.as<uint16_t>(), kd.as<uint16_t>(), vd.as<uint16_t>(), od16.as<uint16_t>(),
                    lsed.as<float>(), s);
    const double tol = sum_tolerance(s.head_dim + s.seq_kv * s.n_heads / s.n_kv_heads);
    const test::AttentionBf16Bounds bound =
        test::attention_bf16_bounds(s, c.q.data(), c.k.data(), c.v.data(), c.dout.data(),
                                    c.out16.data(), c.lse.data(), tol + half_step);
    const std::string at = " (B " + std::to_string(s.batch) + " S " + std::to_string(s.seq_q) +
                           " H/KV " + std::to_string(s.n_heads) + "/" +
                           std::to_string(s.n_kv_heads) + " hd " + std::to_string(s.head_dim) + ")";
    const std::vector<float> got_out = down(out);
    check_true("attention cudnn forward twice, same bits" + at,
               std::memcmp(got_out.data(), out_first.data(), got_out.size() * sizeof(float)) == 0);
    check_within("attention cudnn out / bound" + at, got_out, c.out, widened(bound.out, c.out));
    check("attention cudnn lse" + at, down(lse), c.lse, tol);
    check_within("attention cudnn dq / bound" + at, down(dq), c.dq, widened(bound.dq, c.dq));
    check_within("attention cudnn dk / bound" + at, down(dk), c.dk, widened(bound.dk, c.dk));
    check_within("attention cudnn dv / bound" + at, down(dv), c.dv, widened(bound.dv, c.dv));
  }
  AttentionShape small = cases.front().shape;
  small.head_dim = 32;
  check_true("attention cudnn refuses head_dim 32",
             k.check(small) ==
                 "head_dim a multiple of 8 from 64 to 256 (cuDNN's fused attention), not 32");
}

// The bf16 loss's inputs are multiples of 2^-3 (x) and 2^-4 (the weight) below 1, exact in bf16,
// so every logit -- a sum of 64 products, multiples of 2^-7 below 32 -- is exact in fp32 in any
// order: both forms round the same logits to bf16. Then a row's loss differs by the fp32 sum's
// bound, and an element of d loss / d logits G (each form's rounded once from a value within tol
// of the exact one) by 2^-7 + 2 tol of it, so dx (and d weight) by that times sum_j |G_j| |W_j|.
struct LossBf16Case {
  int64_t n = 300, hidden = 64, vocab = 1000;
  std::vector<float> x, w, dx, dw;
  std::vector<uint16_t> w16;
  std::vector<int32_t> targets;
  float grad_scale = 1.0f / 257.0f;
  CrossEntropyResult result;
};

std::vector<float> dyadic(int64_t n, uint64_t seed, float unit) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = static_cast<float>(std::floor(rng.uniform() * 15.0) - 7.0) * unit;
  return v;
}

LossBf16Case cpu_loss_bf16_case() {
  LossBf16Case c;
  c.x = dyadic(c.n * c.hidden, 60, 0.125f);
  c.w = dyadic(c.vocab * c.hidden, 61, 0.0625f);
  c.w16 = round(c.w);
  c.targets.resize(c.n);
  for (int64_t t = 0; t < c.n; ++t) {
    c.targets[t] = t % 7 == 6 ? kIgnoreIndex : static_cast<int32_t>((t * 13) % c.vocab);
  }
  c.dx.resize(c.n * c.hidden);
  c.dw.assign(c.vocab * c.hidden, 0.5f);
  std::vector<uint16_t> x16(c.x.size());
  CrossEntropyArgs a;
  a.x = c.x.data();
  a.weight = c.w.data();
  a.weight_bf16 = c.w16.data();
  a.x_bf16 = x16.data();
  a.targets = c.targets.data();
  a.n_tokens = c.n;
  a.hidden = c.hidden;
  a.vocab = c.vocab;
  a.dx = c.dx.data();
  a.dweight = c.dw.data();
  a.grad_scale = c.grad_scale;
  a.chunk_tokens = 128;
  c.result = lm_head_cross_entropy(a);
  return c;
}

void test_lm_head_loss_bf16(const LossBf16Case& c) {
  const LmHeadLossKernel& k =
      cuda_kernel<LmHeadLossKernel>("cross_entropy_cuda", OpKind::lm_head_loss);
  DeviceBuffer xd = up(c.x), wd = up(c.w), w16 = up(c.w16), td = up(c.targets),
               dw = up(std::vector<float>(c.vocab * c.hidden, 0.5f));
  DeviceBuffer x16(backend(), c.n * c.hidden, DType::bf16, MemCategory::other),
      dx(backend(), c.n * c.hidden, DType::f32, MemCategory::other);
  CrossEntropyArgs a;
  a.x = xd.as<float>();
  a.weight = wd.as<float>();
  a.weight_bf16 = w16.as<uint16_t>();
  a.x_bf16 = x16.as<uint16_t>();
  a.targets = td.as<int32_t>();
  a.n_tokens = c.n;
  a.hidden = c.hidden;
  a.vocab = c.vocab;
  a.dx = dx.as<float>();
  a.dweight = dw.as<float>();
  a.grad_scale = c.grad_scale;
  a.chunk_tokens = 128;  // three chunks, the last one short
  const CrossEntropyResult got = k.forward_backward(a);
  check_true("lm_head loss bf16 scored tokens", got.n_scored == c.result.n_scored);
  check("lm_head loss bf16 sum", {static_cast<float>(got.loss_sum)},
        {static_cast<float>(c.result.loss_sum)}, sum_tolerance(c.vocab));
  check_true("lm_head loss bf16: x rounded into x_bf16", down<uint16_t>(x16) == round(c.x));
  // The bounds from the exact G of the bf16 logits (fp64 softmax).
  const double tol = sum_tolerance(c.vocab + c.hidden);
  const double step = std::ldexp(1.0, -7) + 2 * tol;
  std::vector<double> dx_bound(c.dx.size(), 0.0), dw_bound(c.dw.size(), tol * 0.5);
  std::vector<double> logits(static_cast<size_t>(c.vocab));
  for (int64_t t = 0; t < c.n; ++t) {
    if (c.targets[t] == kIgnoreIndex) continue;
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < c.vocab; ++j) {
      double l = 0.0;
      for (int64_t h = 0; h < c.hidden; ++h) l += c.x[t * c.hidden + h] * c.w[j * c.hidden + h];
      logits[j] = bf16_to_f32(f32_to_bf16(static_cast<float>(l)));
      m = std::max(m, logits[j]);
    }
    for (int64_t j = 0; j < c.vocab; ++j) sum += std::exp(logits[j] - m);
    for (int64_t j = 0; j < c.vocab; ++j) {
      const double g = std::fabs(std::exp(logits[j] - m) / sum * c.grad_scale -
                                 (j == c.targets[t] ? c.grad_scale : 0.0));
      for (int64_t h = 0; h < c.hidden; ++h) {
        dx_bound[t * c.hidden + h] += step * g * std::fabs(c.w[j * c.hidden + h]);
        dw_bound[j * c.hidden + h] += step * g * std::fabs(c.x[t * c.hidden + h]);
      }
    }
  }
  check_within("lm_head loss bf16 dx / bound", down(dx), c.dx, dx_bound);
  check_within("lm_head loss bf16 dweight / bound", down(dw), c.dw, dw_bound);
}

void test_lm_head_loss() {
  const LmHeadLossKernel& k =
      cuda_kernel<LmHeadLossKernel>("cross_entropy_cuda", OpKind::lm_head_loss);
  const int64_t n = 300, hidden = 64, vocab = 1000;
  const std::vector<float> x = randn(n * hidden, 30), w = randn(vocab * hidden, 31, 0.2f);
  std::vector<int32_t> targets(n);
  for (int64_t t = 0; t < n; ++t) {
    targets[t] = t % 7 == 6 ? kIgnoreIndex : static_cast<int32_t>((t * 13) % vocab);
  }
  CrossEntropyArgs ref;
  ref.x = x.data();
  ref.weight = w.data();
  ref.targets = targets.data();
  ref.n_tokens = n;
  ref.hidden = hidden;
  ref.vocab = vocab;
  ref.grad_scale = 1.0f / 257.0f;
  std::vector<float> ref_dx(n * hidden), ref_dw(vocab * hidden, 0.5f), ref_logits(n * vocab);
  ref.dx = ref_dx.data();
  ref.dweight = ref_dw.data();
  ref.logits = ref_logits.data();
  const CrossEntropyResult want = lm_head_cross_entropy_reference(ref);
  DeviceBuffer xd = up(x), wd = up(w), td = up(targets),
               dw = up(std::vector<float>(vocab * hidden, 0.5f));
  DeviceBuffer dx(backend(), n * hidden, DType::f32, MemCategory::other),
      logits(backend(), n * vocab, DType::f32, MemCategory::other);
  CrossEntropyArgs a = ref;
  a.x = xd.as<float>();
  a.weight = wd.as<float>();
  a.targets = td.as<int32_t>();
  a.dx = dx.as<float>();
  a.dweight = dw.as<float>();
  a.logits = logits.as<float>();
  a.chunk_tokens = 128;  // three chunks, the last one short
  const CrossEntropyResult got = k.forward_backward(a);
  check_true("lm_head loss scored tokens", got.n_scored == want.n_scored);
  check("lm_head loss sum", {static_cast<float>(got.loss_sum)}, {static_cast<float>(want.loss_sum)},
        sum_tolerance(vocab + hidden));
  check("lm_head logits", down(logits), ref_logits, sum_tolerance(hidden));
  check("lm_head dx", down(dx), ref_dx, sum_tolerance(vocab + hidden));
  check("lm_head dweight", down(dw), ref_dw, sum_tolerance(n + hidden));
  std::vector<int32_t> bad = targets;
  bad[77] = -1;
  DeviceBuffer bad_targets = up(bad);
  a.targets = bad_targets.as<int32_t>();
  check_true("lm_head loss refuses target -1 at 77 in one line",
             error_of([&] { k.forward_backward(a); }) ==
                 "cross-entropy: target -1 at token 77 is outside [0, 1000) and not the ignore "
                 "index -100");
}

void test_linear() {
  const LinearKernel& k = cuda_kernel<LinearKernel>("linear_cuda", OpKind::linear);
  const int64_t rows = 37, in = 515, out = 263;
  const std::vector<float> x = randn(rows * in, 40), w = randn(out * in, 41),
                           dy = randn(rows * out, 42), dx0 = randn(rows * in, 43);
  std::vector<float> ref_y(rows * out), ref_dx = dx0, ref_dw(out * in, 0.5f);
  linear_forward_reference(ref_y.data(), x.data(), w.data(), rows, in, out);
  linear_backward_reference(ref_dx.data(), ref_dw.data(), dy.data(), x.data(), w.data(), rows, in,
                            out, /*accumulate_dx=*/true);
  DeviceBuffer xd = up(x), wd = up(w), g = up(dy), dx = up(dx0),
               dw = up(std::vector<float>(out * in, 0.5f));
  DeviceBuffer y(backend(), rows * out, DType::f32, MemCategory::other);
  k.forward(y.as<float>(), xd.as<float>(), wd.as<float>(), rows, in, out);
  k.backward(dx.as<float>(), dw.as<float>(), g.as<float>(), xd.as<float>(), wd.as<float>(), rows,
             in, out, true);
  // fp32 with TF32 off: cuBLASLt's fp32 sums.
  check("linear forward (fp32, TF32 off)", down(y), ref_y, sum_tolerance(in));
  check("linear backward dx (accumulated)", down(dx), ref_dx, sum_tolerance(out));
  check("linear backward dweight", down(dw), ref_dw, sum_tolerance(rows));
  // bf16 operands, fp32 accumulation: exact products of bf16 values summed in fp32.
  const std::vector<uint16_t> x16 = round(x), w16 = round(w), dy16 = round(dy);
  std::vector<float> ref_y16(rows * out), ref_dx16(rows * in), ref_dw16(out * in, 0.0f);
  linear_forward_bf16_reference(ref_y16.data(), x16.data(), w16.data(), rows, in, out);
  linear_backward_bf16_reference(ref_dx16.data(), ref_dw16.data(), dy16.data(), x16.data(),
                                 w16.data(), rows, in, out, false);
  DeviceBuffer xb = up(x16), wb = up(w16), gb = up(dy16),
               dwb = up(std::vector<float>(out * in, 0.0f));
  DeviceBuffer yb16(backend(), rows * out, DType::bf16, MemCategory::other);
  k.forward_bf16(y.as<float>(), xb.as<uint16_t>(), wb.as<uint16_t>(), rows, in, out);
  check("linear forward_bf16", down(y), ref_y16, sum_tolerance(in));
  k.forward_bf16_to_bf16(yb16.as<uint16_t>(), xb.as<uint16_t>(), wb.as<uint16_t>(), rows, in, out);
  check("linear forward_bf16_to_bf16", widen(down<uint16_t>(yb16)), widen(round(ref_y16)),
        kBf16Tolerance);
  k.backward_bf16(dx.as<float>(), dwb.as<float>(), gb.as<uint16_t>(), xb.as<uint16_t>(),
                  wb.as<uint16_t>(), rows, in, out, false);
  check("linear backward_bf16 dx", down(dx), ref_dx16, sum_tolerance(out));
  check("linear backward_bf16 dweight", down(dwb), ref_dw16, sum_tolerance(rows));
}

// The step-wide forms over several arrays (odd sizes, empty ones among them) against the same
// device's per-array ops in the same order: the sum of squares runs the same blocks per array and
// adds them in the same order (bit-equal); AdamW with clipping's scale fused is scale then
// adamw_step per array (the same fp32 arithmetic: bit-equal), its gradients left unscaled.
void test_step_wide_ops(const DeviceOps& ops) {
  const std::vector<int64_t> sizes = {300007, 0, 1, 262145, 5};
  const float grad_scale = 0.37f;
  const AdamWConfig config;
  std::vector<DeviceBuffer> p, g, m, v, p2, g2, m2, v2;
  std::vector<AdamWArrays> table, table2;
  std::vector<std::vector<float>> grads;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const int64_t n = sizes[j];
    std::vector<float> sq = randn(n, 90 + j, 0.1f);
    for (float& x : sq) x = x * x;
    grads.push_back(randn(n, 80 + j));
    for (auto* set : {&p, &p2}) set->push_back(up(randn(n, 70 + j)));
    for (auto* set : {&g, &g2}) set->push_back(up(grads.back()));
    for (auto* set : {&m, &m2}) set->push_back(up(randn(n, 100 + j, 0.1f)));
    for (auto* set : {&v, &v2}) set->push_back(up(sq));
    table.push_back({p[j].as<float>(), g[j].as<float>(), m[j].as<float>(), v[j].as<float>(), n});
    table2.push_back(
        {p2[j].as<float>(), g2[j].as<float>(), m2[j].as<float>(), v2[j].as<float>(), n});
  }
  double per_array = 0.0;
  for (const AdamWArrays& a : table) per_array += ops.sum_squares(a.grad, a.n);
  const double all = ops.sum_squares_all(table);
  check_true("sum_squares_all: per-array sum_squares in order, bit for bit",
             std::memcmp(&all, &per_array, sizeof all) == 0);
  ops.adamw_step_all(table, config, 3e-4f, 7, grad_scale);
  for (const AdamWArrays& a : table2) {
    ops.scale(a.grad, grad_scale, a.n);
    ops.adamw_step(a.param, a.grad, a.exp_avg, a.exp_avg_sq, a.n, config, 3e-4f, 7);
  }
  // Each quantity's arrays end to end.
  const auto joined = [](const std::vector<DeviceBuffer>& arrays) {
    std::vector<float> end_to_end;
    for (const DeviceBuffer& a : arrays) {
      const std::vector<float> host = down(a);
      end_to_end.insert(end_to_end.end(), host.begin(), host.end());
    }
    return end_to_end;
  };
  check("adamw_step_all param (scale then adamw_step, bit for bit)", joined(p), joined(p2), 0.0);
  check("adamw_step_all exp_avg (bit for bit)", joined(m), joined(m2), 0.0);
  check("adamw_step_all exp_avg_sq (bit for bit)", joined(v), joined(v2), 0.0);
  std::vector<float> unscaled;
  for (const std::vector<float>& x : grads) unscaled.insert(unscaled.end(), x.begin(), x.end());
  check_true("adamw_step_all leaves the gradients unscaled", joined(g) == unscaled);
  // The bf16 casts of a unit's copies in one launch: round_to_bf16 per array, bit for bit.
  std::vector<Bf16Cast> casts;
  std::vector<DeviceBuffer> bits_all, bits_each;
  for (size_t j = 0; j < sizes.size(); ++j) {
    bits_all.emplace_back(backend(), sizes[j], DType::bf16, MemCategory::other);
    bits_each.emplace_back(backend(), sizes[j], DType::bf16, MemCategory::other);
    casts.push_back({bits_all[j].as<uint16_t>(), p[j].as<float>(), sizes[j]});
    ops.round_to_bf16(bits_each[j].as<uint16_t>(), p[j].as<float>(), sizes[j]);
  }
  ops.round_to_bf16_all(casts);
  bool same = true;
  for (size_t j = 0; j < sizes.size(); ++j) {
    same = same && down<uint16_t>(bits_all[j]) == down<uint16_t>(bits_each[j]);
  }
  check_true("round_to_bf16_all: round_to_bf16 per array, bit for bit", same);
}

void test_device_ops() {
  const DeviceOps& ops = kernel_registry().device_ops(DeviceKind::cuda);
  const int64_t n = 300007;
  std::vector<float> a = randn(n, 50), b = randn(n, 51);
  DeviceBuffer ad = up(a), bd = up(b);
  ops.add(ad.as<float>(), bd.as<float>(), n);
  ops.scale(ad.as<float>(), 0.75f, n);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = (a[i] + b[i]) * 0.75f;
  check("add then scale", down(ad), want, 0.0);
  double squares = 0.0;
  for (const float v : want) squares += static_cast<double>(v) * v;
  check("sum_squares (fp64)", {static_cast<float>(ops.sum_squares(ad.as<float>(), n))},
        {static_cast<float>(squares)}, 1e-12 * static_cast<double>(n));
  check_true("find_nonfinite: none", ops.find_nonfinite(ad.as<float>(), n) == -1);
  {
    // The linear's bias (Qwen2's q/k/v): the same additions as the CPU's, in the same order (each
    // column summed over the rows in order), so bit-equal. 37 rows of 263 features.
    const int64_t rows = 37, features = 263;
    const std::vector<float> y = randn(rows * features, 54), bias = randn(features, 55),
                             dy = randn(rows * features, 56), db = randn(features, 57);
    std::vector<float> want_y = y, want_db = db;
    bias_forward(want_y.data(), bias.data(), rows, features);
    bias_backward(want_db.data(), dy.data(), rows, features);
    DeviceBuffer yd = up(y), biasd = up(bias), dyd = up(dy), dbd = up(db);
    ops.bias_forward(yd.as<float>(), biasd.as<float>(), rows, features);
    ops.bias_backward(dbd.as<float>(), dyd.as<float>(), rows, features);
    check("bias_forward (the CPU's, bit for bit)", down(yd), want_y, 0.0);
    check("bias_backward (the CPU's, bit for bit)", down(dbd), want_db, 0.0);
  }
  std::vector<float> with_nan = want;
  with_nan[200001] = INFINITY;
  with_nan[123457] = NAN;
  DeviceBuffer nd = up(with_nan);
  check_true("find_nonfinite: the first of two", ops.find_nonfinite(nd.as<float>(), n) == 123457);
  DeviceBuffer bits(backend(), n, DType::bf16, MemCategory::other);
  ops.round_to_bf16(bits.as<uint16_t>(), nd.as<float>(), n);
  const std::vector<uint16_t> rounded = down<uint16_t>(bits);
  check_true("round_to_bf16 is core's f32_to_bf16, NaN and infinity included",
             rounded == round(with_nan));
  DeviceBuffer wide(backend(), n, DType::f32, MemCategory::other);
  ops.widen_bf16(wide.as<float>(), bits.as<uint16_t>(), n);
  const std::vector<float> widened = down(wide), want_wide = widen(rounded);
  check_true("widen_bf16 is exact",
             std::memcmp(widened.data(), want_wide.data(), sizeof(float) * n) == 0);
  DeviceBuffer keep = up(want), kept_bits(backend(), n, DType::bf16, MemCategory::other);
  ops.round_to_bf16_keeping(keep.as<float>(), kept_bits.as<uint16_t>(), n);
  check_true("round_to_bf16_keeping: values and bits",
             down<uint16_t>(kept_bits) == round(want) && down(keep) == widen(round(want)));
  ops.zero(keep.as<float>(), n);
  check_true("zero", down(keep) == std::vector<float>(n, 0.0f));
  // AdamW, step 7.
  std::vector<float> p = randn(n, 52), m = randn(n, 53, 0.1f), v = randn(n, 54, 0.1f);
  for (float& x : v) x = x * x;
  std::vector<float> rp = p, rm = m, rv = v;
  const AdamWConfig config;
  adamw_update_reference(rp.data(), b.data(), rm.data(), rv.data(), n,
                         adamw_scalars(config, 3e-4f, 7));
  DeviceBuffer pd = up(p), md = up(m), vd = up(v);
  ops.adamw_step(pd.as<float>(), bd.as<float>(), md.as<float>(), vd.as<float>(), n, config, 3e-4f,
                 7);
  check("adamw param", down(pd), rp, sum_tolerance(8));
  check("adamw exp_avg", down(md), rm, sum_tolerance(4));
  check("adamw exp_avg_sq", down(vd), rv, sum_tolerance(4));
  test_step_wide_ops(ops);
}

// The MoE kernels against the CPU's ops on one tiny sparse block: N tokens no block divides, E
// experts some of which get no token, k of them per token. The CPU's results are computed before
// CUDA becomes the ops' backend. The router's ids must be the CPU's (exact ties included: tokens
// whose logits are all equal); the dispatch plan (row_of, offsets) and the gathers are exact; the
// fp32 experts chain three GEMMs (lengths h, Im and, for the weight gradients, an expert's rows),
// so they are held to the fp32 bound of the chained lengths. The bf16 forms run on dyadic inputs
// (a few bits each), so the gate and up GEMMs are exact in fp32 on both sides and round alike: the
// forward's one point where the two may differ is act's rounding (expf against the CPU's exp
// approximation), one bf16 ulp, 2^-7 of each product it enters; the backward adds d gate's and d
// up's roundings after inexact fp32 sums: three rounding points, 3 x 2^-7 normwise.
struct MoeCase {
  ExpertsShape shape{77, 40, 24, 9, 3};
  std::vector<float> logits, x, dy, w_gate, w_up, w_down, dweight_in, dprobs_all;
  std::vector<int32_t> index, row_of, offsets;
  std::vector<float> probs, weight, dlogits;
  std::vector<double> counts, prob_sums;
  // [0]: fp32 on normal inputs; [1]: bf16 on dyadic ones.
  struct Run {
    std::vector<float> x, dy, w_gate, w_up, w_down;
    std::vector<float> y, dx, dweight, g_gate, g_up, g_down;
  } runs[2];
};

struct MoeRooms {  // one staged call's activations and scratch, in the running backend's memory
  explicit MoeRooms(const ExpertsShape& sh) {
    const int64_t R = sh.rows(), h = sh.hidden, Im = sh.inter;
    const auto f32 = [](int64_t n) {
      return DeviceBuffer(backend(), n, DType::f32, MemCategory::other);
    };
    gate = f32(R * Im), upr = f32(R * Im), act = f32(R * Im), x = f32(R * h), y = f32(R * h),
    dgate = f32(R * Im), dup = f32(R * Im), dact = f32(R * Im), w_rows = f32(R),
    dweight_rows = f32(R), out = f32(R * h);
    row_of = DeviceBuffer(backend(), R, DType::i32, MemCategory::other);
    offsets = DeviceBuffer(backend(), sh.n_experts + 1, DType::i32, MemCategory::other);
  }
  ExpertsActivations activations() const {
    return {gate.as<float>(), upr.as<float>(), act.as<float>(), row_of.as<int32_t>(),
            offsets.as<int32_t>()};
  }
  ExpertsScratch scratch() const {
    return {x.as<float>(),    y.as<float>(),      dgate.as<float>(),        dup.as<float>(),
            dact.as<float>(), w_rows.as<float>(), dweight_rows.as<float>(), out.as<float>()};
  }
  DeviceBuffer gate, upr, act, x, y, dgate, dup, dact, w_rows, dweight_rows, out, row_of, offsets;
};

// The stage slots' kernels, composed as SparseMoeBlock composes them (nn/layers.cpp).
struct StageKernels {
  const MoeDispatchKernel& dispatch;
  const GroupedExpertsKernel& grouped;
  const MoeCombineKernel& combine;
};

// The experts (fp32 or bf16) over run's inputs in the running backend's memory, forward then
// backward, through `kernel` or, when `stages` is set, through the stage kernels; the outputs and
// gradients (accumulated onto 0.25) back into run.
void run_staged(const ExpertsKernel& kernel, const StageKernels* stages, bool bf16,
                const ExpertsShape& sh, const std::vector<int32_t>& index,
                const std::vector<float>& weight, MoeCase::Run& run) {
  MoeRooms rooms(sh);
  const ExpertsActivations act = rooms.activations();
  const ExpertsScratch s = rooms.scratch();
  const int64_t wn = sh.n_experts * sh.inter * sh.hidden;
  DeviceBuffer x_buf = up(run.x), dy_buf = up(run.dy), index_buf = up(index),
               weight_buf = up(weight);
  DeviceBuffer wg = up(run.w_gate), wu = up(run.w_up), wd = up(run.w_down);
  DeviceBuffer wg16 = up(round(run.w_gate)), wu16 = up(round(run.w_up)),
               wd16 = up(round(run.w_down));
  const std::vector<float> quarter(static_cast<size_t>(wn), 0.25f);
  DeviceBuffer gg = up(quarter), gu = up(quarter), gd = up(quarter);
  DeviceBuffer y_buf(backend(), sh.n_tokens * sh.hidden, DType::f32, MemCategory::other),
      dx_buf(backend(), sh.n_tokens * sh.hidden, DType::f32, MemCategory::other),
      dweight_buf(backend(), sh.rows(), DType::f32, MemCategory::other);
  const ExpertGrads grads{gg.as<float>(), gu.as<float>(), gd.as<float>()};
  const ExpertWeightsBf16 wb{wg16.as<uint16_t>(), wu16.as<uint16_t>(), wd16.as<uint16_t>()};
  const ExpertWeights wf{wg.as<float>(), wu.as<float>(), wd.as<float>()};
  float* y = y_buf.as<float>();
  float* dx = dx_buf.as<float>();
  float* dweight = dweight_buf.as<float>();
  const float* x = x_buf.as<float>();
  const float* dy = dy_buf.as<float>();
  const float* w = weight_buf.as<float>();
  const int32_t* idx = index_buf.as<int32_t>();
  if (stages == nullptr && bf16) {
    kernel.forward_bf16(y, act, s, x, idx, w, wb, sh);
    kernel.backward_bf16(dx, dweight, grads, s, dy, act, x, idx, w, wb, sh);
  } else if (stages == nullptr) {
    kernel.forward(y, act, s, x, idx, w, wf, sh);
    kernel.backward(dx, dweight, grads, s, dy, act, x, idx, w, wf, sh);
  } else {
    const StageKernels& k = *stages;
    auto* x_rows = reinterpret_cast<uint16_t*>(s.x);  // bf16: (R, h) in the first half of s.x
    const auto gather = [&] {
      if (bf16) {
        k.dispatch.forward_bf16(x_rows, x, act.row_of, sh);
      } else {
        k.dispatch.forward(s.x, x, act.row_of, sh);
      }
    };
    k.dispatch.plan(act.row_of, act.offsets, idx, sh);
    gather();
    if (bf16) {
      k.grouped.forward_bf16(s.y, act, s, x_rows, act.offsets, wb, sh);
    } else {
      k.grouped.forward(s.y, act, s, s.x, act.offsets, wf, sh);
    }
    k.combine.forward(y, s.y, act.row_of, idx, w, sh);
    k.combine.backward(s.y, s.w_rows, dy, w, act.row_of, sh);
    gather();  // as the block's backward: other layers' forwards reuse s.x
    if (bf16) {
      k.grouped.backward_bf16(s.y, s.dweight_rows, grads, s, s.w_rows, act, x_rows, act.offsets, wb,
                              sh);
    } else {
      k.grouped.backward(s.y, s.dweight_rows, grads, s, s.w_rows, act, s.x, act.offsets, wf, sh);
    }
    k.dispatch.backward(dx, dweight, s.y, s.dweight_rows, act.row_of, sh);
  }
  run.y = down(y_buf), run.dx = down(dx_buf), run.dweight = down(dweight_buf);
  run.g_gate = down(gg), run.g_up = down(gu), run.g_down = down(gd);
}

MoeCase cpu_moe_case() {
  MoeCase c;
  const ExpertsShape& sh = c.shape;
  const int64_t N = sh.n_tokens, E = sh.n_experts, k = sh.top_k, h = sh.hidden, Im = sh.inter;
  c.logits = randn(N * E, 100, 2.0f);
  for (int64_t e = 0; e < E; ++e) c.logits[5 * E + e] = c.logits[6 * E + e] = 0.5f;  // ties
  // Experts 7 and 8 get no token: their logits far below the others.
  for (int64_t t = 0; t < N; ++t) c.logits[t * E + 7] = c.logits[t * E + 8] = -60.0f;
  c.index.resize(N * k), c.weight.resize(N * k), c.probs.resize(N * E), c.dlogits.resize(N * E);
  router_topk_forward(c.index.data(), c.weight.data(), c.probs.data(), c.logits.data(), N, E, k,
                      true);
  c.dweight_in = randn(N * k, 101), c.dprobs_all = randn(E, 102, 0.01f);
  router_topk_backward(c.dlogits.data(), c.dweight_in.data(), c.dprobs_all.data(), c.probs.data(),
                       c.index.data(), N, E, k, true);
  c.row_of.resize(N * k), c.offsets.resize(E + 1);
  moe_dispatch_plan(c.row_of.data(), c.offsets.data(), c.index.data(), sh);
  c.counts.assign(E, 1.0), c.prob_sums.assign(E, 0.5);
  load_balancing_accumulate(c.counts.data(), c.prob_sums.data(), c.probs.data(), c.index.data(), N,
                            E, k);
  const int64_t wn = E * Im * h;
  MoeCase::Run& f = c.runs[0];
  f.x = randn(N * h, 103), f.dy = randn(N * h, 104), f.w_gate = randn(wn, 105, 0.2f),
  f.w_up = randn(wn, 106, 0.2f), f.w_down = randn(wn, 107, 0.2f);
  MoeCase::Run& b = c.runs[1];
  b.x = dyadic(N * h, 108, 0.125f), b.dy = dyadic(N * h, 109, 0.125f),
  b.w_gate = dyadic(wn, 110, 0.0625f), b.w_up = dyadic(wn, 111, 0.0625f),
  b.w_down = dyadic(wn, 112, 0.0625f);
  const ExpertsKernel& cpu =
      std::get<ExpertsKernel>(kernel_registry().get("experts_staged", OpKind::experts).impl);
  run_staged(cpu, nullptr, false, sh, c.index, c.weight, f);
  run_staged(cpu, nullptr, true, sh, c.index, c.weight, b);
  return c;
}

void test_moe(const MoeCase& c) {
  const ExpertsShape& sh = c.shape;
  const int64_t N = sh.n_tokens, E = sh.n_experts, k = sh.top_k, h = sh.hidden, Im = sh.inter;
  const RouterKernel& router = cuda_kernel<RouterKernel>("router_topk_cuda", OpKind::router);
  DeviceBuffer logits = up(c.logits);
  DeviceBuffer index(backend(), N * k, DType::i32, MemCategory::other),
      weight(backend(), N * k, DType::f32, MemCategory::other),
      probs(backend(), N * E, DType::f32, MemCategory::other),
      dlogits(backend(), N * E, DType::f32, MemCategory::other);
  router.forward(index.as<int32_t>(), weight.as<float>(), probs.as<float>(), logits.as<float>(), N,
                 E, k, true);
  check_true("router ids are the CPU's (ties: the lower expert)", down<int32_t>(index) == c.index);
  check("router probs", down(probs), c.probs, sum_tolerance(E));
  check("router weights", down(weight), c.weight, sum_tolerance(E + k));
  // The backward over the CPU's forward: its fp64 sums are the CPU's operations.
  DeviceBuffer cpu_probs = up(c.probs), cpu_index = up(c.index), dw = up(c.dweight_in),
               all = up(c.dprobs_all);
  router.backward(dlogits.as<float>(), dw.as<float>(), all.as<float>(), cpu_probs.as<float>(),
                  cpu_index.as<int32_t>(), N, E, k, true);
  check("router backward dlogits", down(dlogits), c.dlogits, sum_tolerance(E));
  check_true("router refuses top_k 10 of 9 experts in one line",
             error_of([&] {
               router.forward(index.as<int32_t>(), weight.as<float>(), probs.as<float>(),
                              logits.as<float>(), N, E, E + 1, true);
             }) == "router: num_experts_per_tok (10) must be in [1, num_experts = 9]");

  const MoeDispatchKernel& dispatch =
      cuda_kernel<MoeDispatchKernel>("moe_dispatch_cuda", OpKind::moe_dispatch);
  DeviceBuffer row_of(backend(), N * k, DType::i32, MemCategory::other),
      offsets(backend(), E + 1, DType::i32, MemCategory::other);
  dispatch.plan(row_of.as<int32_t>(), offsets.as<int32_t>(), cpu_index.as<int32_t>(), sh);
  check_true("moe_dispatch plan: row_of is the CPU's", down<int32_t>(row_of) == c.row_of);
  check_true("moe_dispatch plan: offsets are the CPU's", down<int32_t>(offsets) == c.offsets);
  std::vector<int32_t> bad = c.index;
  bad[3 * k + 1] = static_cast<int32_t>(E);
  DeviceBuffer bad_index = up(bad);
  check_true("moe_dispatch refuses expert 9 at token 3 in one line",
             error_of([&] {
               dispatch.plan(row_of.as<int32_t>(), offsets.as<int32_t>(), bad_index.as<int32_t>(),
                             sh);
             }) == "experts: token 3 is routed to expert 9, outside [0, 9)");

  const DeviceOps& ops = device_ops();
  std::vector<double> counts(E, 1.0), prob_sums(E, 0.5);
  ops.load_balancing_accumulate(counts.data(), prob_sums.data(), cpu_probs.as<float>(),
                                cpu_index.as<int32_t>(), N, E, k);
  check_true("load_balancing_accumulate: the CPU's counts", counts == c.counts);
  check_true("load_balancing_accumulate: the CPU's probability sums (its adds in its order)",
             prob_sums == c.prob_sums);
  std::vector<float> want_grad(E);
  load_balancing_grad(want_grad.data(), c.counts.data(), E, 3 * N, 0.01);
  DeviceBuffer grad(backend(), E, DType::f32, MemCategory::other);
  ops.load_balancing_grad(grad.as<float>(), c.counts.data(), E, 3 * N, 0.01);
  check_true("load_balancing_grad: the CPU's values in device memory", down(grad) == want_grad);

  // The stage slots' kernels (moe_dispatch_cuda, grouped_experts_cuda, moe_combine_cuda) composed
  // as a sparse block composes them, and experts_staged_cuda (the same stages composed inside).
  const ExpertsKernel& staged = cuda_kernel<ExpertsKernel>("experts_staged_cuda", OpKind::experts);
  const StageKernels stages{
      dispatch, cuda_kernel<GroupedExpertsKernel>("grouped_experts_cuda", OpKind::grouped_experts),
      cuda_kernel<MoeCombineKernel>("moe_combine_cuda", OpKind::moe_combine)};
  const double chain = sum_tolerance(sh.rows() + h + Im);
  for (const auto& [bf16, slots] :
       {std::pair<bool, bool>{false, true}, {true, true}, {false, false}, {true, false}}) {
    const MoeCase::Run& want = c.runs[bf16 ? 1 : 0];
    MoeCase::Run got = want;
    run_staged(staged, slots ? &stages : nullptr, bf16, sh, c.index, c.weight, got);
    const std::string form = std::string(slots ? "moe stage kernels " : "experts_staged_cuda ") +
                             (bf16 ? "bf16 " : "fp32 ");
    const double fwd = bf16 ? kBf16Tolerance + sum_tolerance(Im) : chain;
    const double bwd = bf16 ? 3 * kBf16Tolerance + chain : chain;
    check(form + "y", got.y, want.y, fwd);
    check(form + "dx", got.dx, want.dx, bwd);
    check(form + "d weight", got.dweight, want.dweight, bwd);
    check(form + "d gate_proj", got.g_gate, want.g_gate, bwd);
    check(form + "d up_proj", got.g_up, want.g_up, bwd);
    check(form + "d down_proj", got.g_down, want.g_down, bwd);
  }
}

// The decode GEMVs (DeviceOps::gemv, gemv.cu) against ops/gemv's reference (fp64 sums, x rounded
// to bf16 for a bf16 weight): q/k/v-like products fused in one call (rows 300, 37, 37: no block of
// 8 warps divides them), fp32 and bf16 weights mixed, columns a multiple of the 8-element chunk
// (vector loads) and not (1003: every element read singly), a weight whose view starts 2 bytes
// past an aligned address (singly too), and an lm_head-sized bf16 product. A bf16 weight times x's
// bf16 rounding is exact in fp32 (8 + 8 significant bits), so only the fp32 sum of `cols` products
// errs: sum_tolerance(cols), normwise per product.
void test_gemv() {
  const DeviceOps& ops = kernel_registry().device_ops(DeviceKind::cuda);
  struct Case {
    int64_t cols;
    std::vector<int64_t> rows;
    std::vector<DType> dtypes;
    int64_t offset;  // elements past the start of the weight's buffer
  };
  const std::vector<Case> cases = {
      {1000, {300, 37, 37}, {DType::f32, DType::bf16, DType::f32}, 0},
      {1003, {300, 37, 37}, {DType::bf16, DType::bf16, DType::f32}, 0},
      {1024, {129}, {DType::bf16}, 1},
      {1024, {129}, {DType::f32}, 1},
      {1024, {32003}, {DType::bf16}, 0},
  };
  uint64_t seed = 70;
  for (const Case& c : cases) {
    const std::vector<float> x = randn(c.cols, seed++);
    DeviceBuffer xd = up(x);
    std::vector<DeviceBuffer> weights, outputs;
    std::vector<std::vector<float>> w_f32;
    std::vector<std::vector<uint16_t>> w_bf16;
    std::vector<GemvProduct> host, device;
    std::vector<std::vector<float>> want(c.rows.size());
    for (size_t i = 0; i < c.rows.size(); ++i) {
      const int64_t numel = c.rows[i] * c.cols;
      std::vector<float> w = randn(numel + c.offset, seed++);
      want[i].resize(static_cast<size_t>(c.rows[i]));
      if (c.dtypes[i] == DType::bf16) {
        w_bf16.push_back(round(w));
        weights.push_back(up(w_bf16.back()));
        host.push_back(
            {{DType::bf16, w_bf16.back().data() + c.offset, c.rows[i], c.cols}, want[i].data()});
        device.push_back(
            {{DType::bf16, weights.back().as<uint16_t>() + c.offset, c.rows[i], c.cols}, nullptr});
      } else {
        w_f32.push_back(std::move(w));
        weights.push_back(up(w_f32.back()));
        host.push_back(
            {{DType::f32, w_f32.back().data() + c.offset, c.rows[i], c.cols}, want[i].data()});
        device.push_back(
            {{DType::f32, weights.back().as<float>() + c.offset, c.rows[i], c.cols}, nullptr});
      }
      outputs.emplace_back(backend(), c.rows[i], DType::f32, MemCategory::other);
      device.back().y = outputs.back().as<float>();
    }
    gemv_forward_reference(host, x.data());
    ops.gemv(device, xd.as<float>());
    for (size_t i = 0; i < c.rows.size(); ++i) {
      check("gemv " + std::string(dtype_name(c.dtypes[i])) + " product " + std::to_string(i) +
                " of " + std::to_string(c.rows.size()) + " (" + std::to_string(c.rows[i]) + " x " +
                std::to_string(c.cols) + ", offset " + std::to_string(c.offset) + ")",
            down(outputs[i]), want[i], sum_tolerance(c.cols));
    }
  }
}

// What a LoRA step adds. Its dropout (DeviceOps::lora_dropout): the CPU's mask and products bit for
// bit (an exact hash and one rounded product per element, the product never fused with the
// accumulation), over an odd feature count and rows crossing sequences; forward, in place (the bf16
// path masks its widened input in place: it has no bf16 form of its own) and accumulating (the
// backward's dx).
void test_lora_ops() {
  const DeviceOps& ops = kernel_registry().device_ops(DeviceKind::cuda);
  const int64_t n = 1031, features = 263;
  const LoraDropoutCall call{0.1, mix64(mix64(42 ^ 7) ^ 3), 9, 97, 5};
  const std::vector<float> x = randn(n * features, 60), base = randn(n * features, 61);
  std::vector<float> want(x.size()), want_acc = base;
  lora_dropout_apply(want.data(), x.data(), n, features, call, false);
  lora_dropout_apply(want_acc.data(), x.data(), n, features, call, true);
  DeviceBuffer xd = up(x), out(backend(), n * features, DType::f32, MemCategory::other),
               acc = up(base);
  ops.lora_dropout(out.as<float>(), xd.as<float>(), n, features, call, false);
  ops.lora_dropout(acc.as<float>(), xd.as<float>(), n, features, call, true);
  check("lora_dropout (the CPU's mask, bit for bit)", down(out), want, 0.0);
  check("lora_dropout accumulating (bit for bit)", down(acc), want_acc, 0.0);
  ops.lora_dropout(xd.as<float>(), xd.as<float>(), n, features, call, false);
  check("lora_dropout in place (bit for bit)", down(xd), want, 0.0);
  // B^T (out 263 x rank 7): a copy, exact.
  const int64_t out_features = 263, rank = 7;
  const std::vector<float> b = randn(out_features * rank, 62);
  std::vector<float> want_t(b.size());
  transpose(want_t.data(), b.data(), out_features, rank);
  DeviceBuffer bd = up(b), td(backend(), out_features * rank, DType::f32, MemCategory::other);
  ops.transpose(td.as<float>(), bd.as<float>(), out_features, rank);
  check("transpose (LoRA's B^T, exact)", down(td), want_t, 0.0);
}

}  // namespace
}  // namespace titan

int main() {
  using namespace titan;
  try {
    Backend& cuda = backend_named("cuda");
    std::printf("%s\n", cuda.name().c_str());
    const std::vector<AttentionBf16Case> attention_bf16 = cpu_attention_bf16_cases();
    const LossBf16Case loss_bf16 = cpu_loss_bf16_case();
    const MoeCase moe = cpu_moe_case();
    select_backend("cuda");
    std::printf("%-64s %10s %10s\n", "check", "error", "tolerance");
    test_device_ops();
    test_lora_ops();
    test_rms_norm();
    test_rope();
    test_swiglu();
    test_embedding();
    test_linear();
    test_lm_head_loss();
    test_attention();
    test_lm_head_loss_bf16(loss_bf16);
    test_attention_bf16(attention_bf16);
    test_moe(moe);
    test_gemv();
    test_attention_cudnn(attention_bf16);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  if (g_failures > 0) {
    std::fprintf(stderr, "titan_cuda_kernels_test: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf("titan_cuda_kernels_test: ok\n");
  return 0;
}
