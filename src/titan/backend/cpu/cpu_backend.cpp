#include "titan/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/peak.h"
#include "titan/backend/cpu/threads.h"
#include "titan/backend/cpu/vec.h"
#include "titan/core/error.h"

namespace titan {
namespace {

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }

  std::string name() const override {
    return detail::concat("cpu: ", cpu_info().model_name, " (", isa_name(active_isa()), ", ",
                          thread_count(), " threads)");
  }

  std::optional<double> peak_gflops(DType dtype) const override {
    if (dtype == DType::f32) return cpu_peak_fp32_gflops(thread_count());
    if (dtype == DType::bf16) return cpu_peak_bf16_gflops(thread_count());
    return std::nullopt;
  }

  std::string peak_source(DType dtype) const override {
    if (dtype != DType::f32 && dtype != DType::bf16) {
      return detail::concat("no ", dtype_name(dtype), " peak on the CPU (it knows fp32 and bf16)");
    }
    const CpuPeak& peak = cpu_peak();
    const int threads = std::clamp(thread_count(), 1, cpu_info().logical_cpus);
    char line[320];
    if (dtype == DType::bf16 && peak.bf16_unit == Bf16Unit::amx) {
      std::snprintf(line, sizeof line,
                    "the bf16 peak of %d threads at %.1f GFLOP/s each: %.3f GHz x %d FLOP/cycle "
                    "(AMX bf16 tile dot products); %s",
                    threads, peak.bf16_gflops_per_core(), peak.clock_ghz, peak.amx_flops_per_cycle,
                    peak.source.c_str());
      return line;
    }
    const bool bf16 = dtype == DType::bf16;
    std::snprintf(line, sizeof line,
                  "the %s peak of %d threads at %.1f GFLOP/s each: %.3f GHz x %d FMA/cycle x "
                  "%d lanes x 2%s; %s",
                  bf16 ? "bf16" : "fp32", threads,
                  bf16 ? peak.bf16_gflops_per_core() : peak.fp32_gflops_per_core(), peak.clock_ghz,
                  peak.fma_per_cycle, peak.fp32_lanes,
                  !bf16                ? ""
                  : peak.native_bf16() ? " x 2 (AVX512_BF16 dot products)"
                                       : " (no native bf16: widened to fp32)",
                  peak.source.c_str());
    return line;
  }

  bool native(DType dtype) const override {
    return dtype == DType::f32 || (dtype == DType::bf16 && cpu_peak().native_bf16());
  }

  size_t memory_bytes() const override { return cpu_info().memory_bytes; }

  int threads() const override { return thread_count(); }

  MemorySpace& memory() override { return host_memory(); }
  MemorySpace& host_staging_memory() override { return host_memory(); }
  void* allocate(size_t bytes, MemCategory category) override {
    return mem_allocate(bytes, category);
  }
  void release(void* ptr, size_t bytes, MemCategory category) override {
    mem_release(ptr, bytes, category);
  }
  // Host and device are one memory: every copy is a memcpy.
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }

  void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) override {
    titan::gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_f32_block(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) override {
    titan::sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) override {
    titan::gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_bf16_to_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                         uint16_t* c, int64_t ldc) override {
    titan::gemm_bf16_to_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
  }

  const VecKernels& vec() const override { return titan::vec(); }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend cpu;
  return cpu;
}

}  // namespace titan
