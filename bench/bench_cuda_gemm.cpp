// GEMM throughput of the CUDA backend (cuBLAS behind Backend::gemm_f32 / gemm_bf16 /
// gemm_bf16_to_bf16) on a square 8192^3 product and on the shapes of a `small` training step and a
// Qwen3-0.6B prefill, and its device-to-device copy rate, for docs/GEMM.md;
// bench/cuda_gemm_torch.py times PyTorch's matmul and copy on the same shapes in the same run, the
// reference the rates are read against. With no GPU it prints "no CUDA device (...)" and exits 1.
// Usage: bench_cuda_gemm
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cuda/cuda_backend.h"
#include "titan/backend/device_buffer.h"
#include "titan/core/dtype.h"

namespace {

using titan::Trans;

struct GemmShape {
  const char* what;
  Trans trans_a, trans_b;
  int64_t m, n, k;
};

// Row-major, as the model calls them: y = x W^T (forward), dX = dY W, dW = dY^T X.
const GemmShape kShapes[] = {
    {"square 8192^3", Trans::no, Trans::no, 8192, 8192, 8192},
    {"small mlp up, x W^T (2048 x 2048 x 512)", Trans::no, Trans::yes, 2048, 2048, 512},
    {"small mlp down dX, dY W (2048 x 512 x 2048)", Trans::no, Trans::no, 2048, 512, 2048},
    {"small mlp up dW, dY^T X (2048 x 512 x 2048)", Trans::yes, Trans::no, 2048, 512, 2048},
    {"small lm_head chunk, x E^T (512 x 151936 x 512)", Trans::no, Trans::yes, 512, 151936, 512},
    {"0.6B prefill q, x W^T (512 x 2048 x 1024)", Trans::no, Trans::yes, 512, 2048, 1024},
    {"0.6B prefill mlp up, x W^T (512 x 3072 x 1024)", Trans::no, Trans::yes, 512, 3072, 1024},
};

// Values uniform in [-1, 1): a GPU's clock under a long GEMM depends on how many bits its operands
// toggle, so constant operands (zeros, ones) run faster than a model's and overstate the rate.
void fill_uniform(titan::DeviceBuffer& buf, uint32_t seed) {
  std::vector<float> values(static_cast<size_t>(buf.numel()));
  for (float& x : values) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  if (buf.dtype() == titan::DType::f32) {
    titan::copy_from_host(buf, values.data(), titan::DType::f32, buf.numel());
    return;
  }
  std::vector<uint16_t> bits(values.size());
  std::transform(values.begin(), values.end(), bits.begin(), titan::f32_to_bf16);
  titan::copy_from_host(buf, bits.data(), titan::DType::bf16, buf.numel());
}

// Device-to-device copy rate, bytes read plus bytes written: the bandwidth bound of the
// memory-bound kernels the backend will run (decode, elementwise ops).
void print_copy_rate(titan::Backend& cuda) {
  const int64_t numel = int64_t{1} << 30;  // 2 GiB of bf16 each way
  titan::DeviceBuffer from(cuda, numel, titan::DType::bf16, titan::MemCategory::other);
  titan::DeviceBuffer to(cuda, numel, titan::DType::bf16, titan::MemCategory::other);
  // cudaMemcpy between two device buffers does not wait for the copy; one to the host does.
  uint16_t probe = 0;
  auto wait = [&] { cuda.copy_to_host(&probe, to.data(), sizeof probe); };
  copy_buffer(to, from);
  wait();
  double best = 1e30;
  for (int trial = 0; trial < 5; ++trial) {
    const double t0 = titan::bench::now_seconds();
    copy_buffer(to, from);
    wait();
    best = std::min(best, titan::bench::now_seconds() - t0);
  }
  std::printf("copy_on_device of %.1f GiB: %.0f GB/s (read + written)\n",
              static_cast<double>(from.bytes()) / (1ull << 30), 2.0 * from.bytes() / best * 1e-9);
}

enum class Route { f32, bf16, bf16_to_bf16 };

const char* route_name(Route r) {
  return r == Route::f32 ? "gemm_f32" : r == Route::bf16 ? "gemm_bf16" : "gemm_bf16_to_bf16";
}

int run(int, char**) {
  const std::unique_ptr<titan::Backend> cuda = titan::make_cuda_backend();
  std::printf("%s\n", cuda->name().c_str());
  print_copy_rate(*cuda);
  std::printf("%-50s %-18s %12s\n", "shape", "route", "GFLOP/s");
  for (const GemmShape& s : kShapes) {
    for (Route route : {Route::f32, Route::bf16, Route::bf16_to_bf16}) {
      const bool bf16_in = route != Route::f32;
      const titan::DType in = bf16_in ? titan::DType::bf16 : titan::DType::f32;
      const titan::DType out =
          route == Route::bf16_to_bf16 ? titan::DType::bf16 : titan::DType::f32;
      const int64_t a_numel = s.m * s.k, b_numel = s.k * s.n, c_numel = s.m * s.n;
      titan::DeviceBuffer a(*cuda, a_numel, in, titan::MemCategory::other);
      titan::DeviceBuffer b(*cuda, b_numel, in, titan::MemCategory::other);
      titan::DeviceBuffer c(*cuda, c_numel, out, titan::MemCategory::other);
      fill_uniform(a, 1);
      fill_uniform(b, 2);
      const int64_t lda = s.trans_a == Trans::no ? s.k : s.m;
      const int64_t ldb = s.trans_b == Trans::no ? s.n : s.k;
      auto gemm = [&] {
        if (route == Route::f32) {
          cuda->gemm_f32(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.as<float>(), lda,
                         b.as<float>(), ldb, 0.0f, c.as<float>(), s.n);
        } else if (route == Route::bf16) {
          cuda->gemm_bf16(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.as<uint16_t>(), lda,
                          b.as<uint16_t>(), ldb, 0.0f, c.as<float>(), s.n);
        } else {
          cuda->gemm_bf16_to_bf16(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.as<uint16_t>(), lda,
                                  b.as<uint16_t>(), ldb, c.as<uint16_t>(), s.n);
        }
      };
      // The GEMMs queue on the default stream; a copy to the host waits for them.
      uint16_t probe = 0;
      auto wait = [&] { cuda->copy_to_host(&probe, c.data(), sizeof probe); };
      const double flops = 2.0 * s.m * s.n * s.k;
      const int reps = std::max(1, static_cast<int>(2e12 / flops));  // ~2 ms of work at 1 PFLOP/s
      gemm();
      wait();
      double best = 1e30;
      for (int trial = 0; trial < 5; ++trial) {
        const double t0 = titan::bench::now_seconds();
        for (int r = 0; r < reps; ++r) gemm();
        wait();
        best = std::min(best, (titan::bench::now_seconds() - t0) / reps);
      }
      std::printf("%-50s %-18s %12.0f\n", s.what, route_name(route), flops / best * 1e-9);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_cuda_gemm", run, argc, argv);
}
