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
#include "titan/dispatch/registry.h"
#include "titan/ops/adamw.h"
#include "titan/ops/attention.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/bias.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/embedding.h"
#include "titan/ops/linear.h"
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

}  // namespace
}  // namespace titan

int main() {
  using namespace titan;
  try {
    Backend& cuda = backend_named("cuda");
    std::printf("%s\n", cuda.name().c_str());
    const std::vector<AttentionBf16Case> attention_bf16 = cpu_attention_bf16_cases();
    const LossBf16Case loss_bf16 = cpu_loss_bf16_case();
    select_backend("cuda");
    std::printf("%-64s %10s %10s\n", "check", "error", "tolerance");
    test_device_ops();
    test_rms_norm();
    test_rope();
    test_swiglu();
    test_embedding();
    test_linear();
    test_lm_head_loss();
    test_attention();
    test_lm_head_loss_bf16(loss_bf16);
    test_attention_bf16(attention_bf16);
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
