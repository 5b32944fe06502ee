// Causal GQA attention's forward and backward on CUDA through the registry, at Qwen3-0.6B's
// training shape (batch 8 x 2048 tokens, 16 query / 8 kv heads x 128, bf16 q, k, v): cuDNN's fused
// SDPA (attention_cuda_cudnn, bf16 forms). bench/cuda_attention_torch.py times PyTorch's
// scaled_dot_product_attention on the same shapes in the same run (scripts/cuda-device-check.sh).
// TFLOP/s count the causal half of the products: forward 2 GEMMs, backward 5, each
// 2 x B x H x S^2 x hd / 2. With no GPU it fails with "no CUDA device (...)", exit status 1.
// Usage: bench_cuda_attention
#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_main.h"
#include "titan/backend/backend.h"
#include "titan/backend/device_buffer.h"
#include "titan/core/rng.h"
#include "titan/dispatch/registry.h"

namespace {

using namespace titan;

// Waits for the stream: a read back of one element (the backend's copies are synchronous).
void sync(const DeviceBuffer& buf) {
  float x = 0.0f;
  backend().copy_to_host(&x, buf.data(), sizeof(float));
}

// The best of 5 timings of `reps` calls, in seconds per call.
template <typename F>
double seconds_per_call(F call, const DeviceBuffer& any, int reps) {
  call();
  sync(any);
  double best = 1e30;
  for (int t = 0; t < 5; ++t) {
    const double start = bench::now_seconds();
    for (int r = 0; r < reps; ++r) call();
    sync(any);
    best = std::min(best, (bench::now_seconds() - start) / reps);
  }
  return best;
}

DeviceBuffer bf16_randn(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng(seed).fill_normal(v.data(), n, 0.0f, 1.0f);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
  DeviceBuffer buf(backend(), n, DType::bf16, MemCategory::other);
  copy_from_host(buf, bits.data(), DType::bf16, n);
  return buf;
}

int run(int, char**) {
  std::printf("%s\n", backend_named("cuda").name().c_str());
  select_backend("cuda");
  const KernelEntry& entry = kernel_registry().get("attention_cuda_cudnn", OpKind::attention);
  const auto& k = std::get<AttentionKernel>(entry.impl);
  AttentionShape s;
  s.batch = 8;
  s.seq_q = s.seq_kv = 2048;
  s.n_heads = 16;
  s.n_kv_heads = 8;
  s.head_dim = 128;
  const int64_t nq = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  DeviceBuffer q = bf16_randn(nq, 1), kk = bf16_randn(nkv, 2), v = bf16_randn(nkv, 3),
               out16 = bf16_randn(nq, 4);
  DeviceBuffer dout(backend(), nq, DType::f32, MemCategory::other),
      out(backend(), nq, DType::f32, MemCategory::other),
      lse(backend(), s.batch * s.n_heads * s.seq_q, DType::f32, MemCategory::other),
      dq(backend(), nq, DType::f32, MemCategory::other),
      dk(backend(), nkv, DType::f32, MemCategory::other),
      dv(backend(), nkv, DType::f32, MemCategory::other);
  backend().memory().zero(dout.data(), dout.bytes());
  const auto forward = [&] {
    k.forward_bf16(out.as<float>(), lse.as<float>(), q.as<uint16_t>(), kk.as<uint16_t>(),
                   v.as<uint16_t>(), s);
  };
  // The backward on the forward's lse and an out of random bits: its time does not depend on them.
  const auto backward = [&] {
    k.backward_bf16(dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(),
                    q.as<uint16_t>(), kk.as<uint16_t>(), v.as<uint16_t>(), out16.as<uint16_t>(),
                    lse.as<float>(), s);
  };
  const double fwd = seconds_per_call(forward, out, 20);
  const double bwd = seconds_per_call(backward, dq, 10);
  const double gemm =
      2.0 * static_cast<double>(s.batch * s.n_heads) * s.seq_q * s.seq_kv * s.head_dim / 2.0;
  std::printf("%-58s %9s %9s\n", "attention_cuda_cudnn, B 8 x S 2048, 16/8 heads x 128, bf16", "ms",
              "TFLOP/s");
  std::printf("%-58s %9.3f %9.1f\n", "  forward (out and lse)", fwd * 1e3, 2 * gemm / fwd * 1e-12);
  std::printf("%-58s %9.3f %9.1f\n", "  backward (dq, dk, dv)", bwd * 1e3, 5 * gemm / bwd * 1e-12);
  std::printf("%-58s %9.3f %9.1f\n", "  forward + backward", (fwd + bwd) * 1e3,
              7 * gemm / (fwd + bwd) * 1e-12);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_cuda_attention", run, argc, argv);
}
