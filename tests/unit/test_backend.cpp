// The backend interface on the CPU: GEMMs, memory and its accounting, the registry, the peak,
// the memory size and threads; the GPU datasheet peaks' table and the device memory count, which
// need no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>
#include <vector>

#include "error_of.h"
#include "titan/backend/backend.h"
#include "titan/backend/cpu/cpu_backend.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/peak.h"
#include "titan/backend/cpu/threads.h"
#include "titan/backend/datasheet_peak.h"
#include "titan/backend/device_buffer.h"
#include "titan/backend/device_memory.h"
#include "titan/core/error.h"
#include "unit/backend_checks.h"

namespace titan {
namespace {

using test::error_of;

TEST(Backend, CpuIsTheActiveBackend) {
  EXPECT_EQ(&backend(), &cpu_backend());
  EXPECT_EQ(&backend_named("cpu"), &cpu_backend());
  EXPECT_EQ(backend().kind(), DeviceKind::cpu);
  EXPECT_EQ(backend().name().rfind("cpu: ", 0), 0u) << backend().name();
  EXPECT_NO_THROW(select_backend("cpu"));
  EXPECT_EQ(error_of([] { backend_named("tpu"); }), "unknown device 'tpu' (cpu, cuda or cuda:N)");
}

TEST(Backend, DeviceNamesAreCpuCudaOrCudaN) {
  EXPECT_EQ(parse_device_name("cpu").kind, DeviceKind::cpu);
  EXPECT_EQ(parse_device_name("cuda").kind, DeviceKind::cuda);
  EXPECT_EQ(parse_device_name("cuda").ordinal, 0);
  EXPECT_EQ(parse_device_name("cuda:3").kind, DeviceKind::cuda);
  EXPECT_EQ(parse_device_name("cuda:3").ordinal, 3);
  for (const char* bad : {"cuda:", "cuda:-1", "cuda:1x", "cuda:x", "CUDA", "gpu", "cpu:0", ""}) {
    EXPECT_EQ(error_of([&] { parse_device_name(bad); }),
              std::string("unknown device '") + bad + "' (cpu, cuda or cuda:N)");
  }
}

// A build without -DTITAN_CUDA, or a machine without a GPU, refuses it in one line; with both, it
// exists and can become the active backend (and the CPU again).
TEST(Backend, CudaIsThereOrRefusedInOneLine) {
  try {
    Backend& cuda = backend_named("cuda");
    EXPECT_EQ(cuda.kind(), DeviceKind::cuda);
    select_backend("cuda");
    EXPECT_EQ(&backend(), &cuda);
    select_backend("cpu");
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.rfind("this titan was built without CUDA (", 0) == 0 ||
                m.rfind("no CUDA device (", 0) == 0)
        << m;
  }
  EXPECT_EQ(&backend(), &cpu_backend());
}

TEST(Backend, CpuGemmsMatchTheReferenceForEveryTranspose) {
  EXPECT_EQ(testing::check_gemms(cpu_backend()), "");
}

// gemm_f32 takes oneDNN's matmul primitive for x W^T and its sgemm otherwise, and sgemm on the
// calling thread inside a parallel region (attention's blocks): every route on every pair.
TEST(Backend, CpuFp32GemmRoutesMatchTheReferenceForEveryTranspose) {
  for (Trans ta : {Trans::no, Trans::yes}) {
    for (Trans tb : {Trans::no, Trans::yes}) {
      const testing::GemmCase t(testing::GemmRoute::f32, ta, tb);
      std::vector<float> c = t.c0;
      sgemm(ta, tb, t.m, t.n, t.k, t.alpha, t.a.data(), t.lda, t.b.data(), t.ldb, t.beta, c.data(),
            t.ldc);
      EXPECT_EQ(t.compare(c, "sgemm"), "");
      c = t.c0;
      matmul_f32(ta, tb, t.m, t.n, t.k, t.alpha, t.a.data(), t.lda, t.b.data(), t.ldb, t.beta,
                 c.data(), t.ldc);
      EXPECT_EQ(t.compare(c, "fp32 matmul"), "");
      std::vector<std::vector<float>> per_thread(2, t.c0);
#pragma omp parallel for num_threads(2)
      for (int i = 0; i < 2; ++i) {
        gemm_f32(ta, tb, t.m, t.n, t.k, t.alpha, t.a.data(), t.lda, t.b.data(), t.ldb, t.beta,
                 per_thread[i].data(), t.ldc);
      }
      for (const std::vector<float>& got : per_thread) {
        EXPECT_EQ(t.compare(got, "gemm_f32 in a parallel region"), "");
      }
    }
  }
}

// The bf16-output bound admits one correct rounding of the fp32 sum and no more: the same sums
// truncated to bf16 (error up to 2^-7, twice what rounding to nearest allows) must fail it.
TEST(Backend, Bf16OutputBoundRejectsTruncation) {
  const testing::GemmCase t(testing::GemmRoute::bf16_to_bf16, Trans::no, Trans::yes);
  std::vector<float> c = t.c0;
  gemm_bf16(t.ta, t.tb, t.m, t.n, t.k, t.alpha, t.a16.data(), t.lda, t.b16.data(), t.ldb, 0.0f,
            c.data(), t.ldc);
  std::vector<float> rounded = c, truncated = c;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) {
      float& r = rounded[i * t.ldc + j];
      float& d = truncated[i * t.ldc + j];
      r = round_to_bf16(r);
      d = bf16_to_f32(static_cast<uint16_t>(std::bit_cast<uint32_t>(d) >> 16));
    }
  }
  EXPECT_EQ(t.compare(rounded, "rounded"), "");
  EXPECT_NE(t.compare(truncated, "truncated"), "");
}

TEST(Backend, CpuCopiesRoundTrip) {
  EXPECT_EQ(testing::check_copies(cpu_backend()), "");
  EXPECT_EQ(testing::check_buffers(cpu_backend()), "");
}

TEST(Backend, CpuMemoryIsChargedToItsCategory) {
  const size_t before = memory_stats().current[static_cast<int>(MemCategory::gradients)];
  {
    const DeviceBuffer g(cpu_backend(), 1000, DType::bf16, MemCategory::gradients);
    EXPECT_EQ(g.bytes(), 2000u);
    EXPECT_EQ(memory_stats().current[static_cast<int>(MemCategory::gradients)], before + 2000);
  }
  EXPECT_EQ(memory_stats().current[static_cast<int>(MemCategory::gradients)], before);
}

TEST(Backend, CopyMismatchesNameBothSides) {
  DeviceBuffer f32(cpu_backend(), 4, DType::f32, MemCategory::other);
  DeviceBuffer bf16(cpu_backend(), 4, DType::bf16, MemCategory::other);
  const std::vector<uint16_t> host(4);
  const std::string on = " on " + cpu_backend().name();
  EXPECT_EQ(error_of([&] { copy_from_host(f32, host.data(), DType::bf16, 4); }),
            "copy of 4 x BF16 from the host into a buffer of 4 x F32" + on);
  EXPECT_EQ(error_of([&] { copy_buffer(f32, bf16); }),
            "copy of a buffer of 4 x BF16" + on + " into one of 4 x F32" + on +
                " (device to device needs one backend, dtype and size)");
  std::vector<float> out(3);
  EXPECT_EQ(error_of([&] { copy_to_host(out.data(), DType::f32, 3, f32); }),
            "copy of a buffer of 4 x F32" + on + " to 3 x F32 on the host");
}

TEST(Backend, CpuVecIsTheActiveIsas) {
  EXPECT_STREQ(cpu_backend().vec().variant, isa_name(active_isa()));
  const std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
  EXPECT_EQ(cpu_backend().vec().dot(a.data(), b.data(), 3), 32.0f);
}

TEST(Backend, CpuPeakPerDtype) {
  const double fp32 = cpu_backend().peak_gflops(DType::f32).value();
  EXPECT_GT(fp32, 0.0);
  const double bf16 = cpu_backend().peak_gflops(DType::bf16).value();
  if (cpu_info().amx_bf16) {
    EXPECT_EQ(cpu_peak().bf16_unit, Bf16Unit::amx);
    EXPECT_GE(bf16, 8.0 * fp32);  // a tile dot product does at least 8x an FMA's FLOPs a cycle
  } else {
    EXPECT_EQ(bf16, cpu_info().avx512_bf16 ? 2.0 * fp32 : fp32);
  }
  EXPECT_FALSE(cpu_backend().peak_gflops(DType::i32).has_value());
}

// What the cores can issue bounds what a GEMM reaches (a busy machine only lowers the GEMM), and
// no x86 core clocks above 7 GHz: a probe that an optimising core short-cuts fails one or the
// other (a chain of immediate adds timed a 4 GHz Sapphire Rapids at 22 GHz, and the fp32 MFU it
// gave was 2.8x too low).
TEST(Backend, CpuPeakBoundsTheGemmCeilings) {
  const CpuPeak& peak = cpu_peak();
  EXPECT_GT(peak.clock_ghz, 0.5);
  EXPECT_LT(peak.clock_ghz, 7.0);
  EXPECT_GE(cpu_backend().peak_gflops(DType::f32).value(), measure_gemm_ceiling_gflops());
  EXPECT_GE(cpu_backend().peak_gflops(DType::bf16).value(), measure_gemm_bf16_ceiling_gflops());
}

// The trainer's start-up log prints this line beside the MFU denominator.
TEST(Backend, CpuPeakSourceSpellsOutThePeak) {
  const CpuPeak& peak = cpu_peak();
  const int threads = std::clamp(thread_count(), 1, cpu_info().logical_cpus);
  char fp32[160];
  std::snprintf(fp32, sizeof fp32,
                "the fp32 peak of %d threads at %.1f GFLOP/s each: %.3f GHz x %d FMA/cycle x %d "
                "lanes x 2; ",
                threads, peak.fp32_gflops_per_core(), peak.clock_ghz, peak.fma_per_cycle,
                peak.fp32_lanes);
  EXPECT_EQ(cpu_backend().peak_source(DType::f32), fp32 + peak.source);
  const std::string bf16 = cpu_backend().peak_source(DType::bf16);
  EXPECT_EQ(bf16.rfind("the bf16 peak of " + std::to_string(threads) + " threads at ", 0), 0u)
      << bf16;
  char amx[80];
  std::snprintf(amx, sizeof amx, "x %d FLOP/cycle (AMX bf16 tile dot products); ",
                peak.amx_flops_per_cycle);
  EXPECT_NE(bf16.find(peak.bf16_unit == Bf16Unit::amx ? amx
                      : peak.bf16_unit == Bf16Unit::avx512_bf16
                          ? "x 2 x 2 (AVX512_BF16 dot products); "
                          : "x 2 (no native bf16: widened to fp32); "),
            std::string::npos)
      << bf16;
  EXPECT_EQ(cpu_backend().peak_source(DType::i32),
            "no I32 peak on the CPU (it knows fp32 and bf16)");
}

// bf16 GEMMs are native where the CPU has AVX512_BF16 dot products (the trainer warns otherwise).
TEST(Backend, CpuNativeDtypesFollowTheIsa) {
  EXPECT_TRUE(cpu_backend().native(DType::f32));
  EXPECT_EQ(cpu_backend().native(DType::bf16), cpu_info().avx512_bf16);
  EXPECT_FALSE(cpu_backend().native(DType::f16));
}

// The MFU denominator on CUDA: the rows the datasheets give, matched on the name and compute
// capability cudaGetDeviceProperties reports, and nothing for any other device or dtype.
TEST(Backend, DatasheetPeaksMatchTheNameAndCapability) {
  const std::optional<DatasheetPeak> h200 = datasheet_peak("NVIDIA H200", 9, 0);
  ASSERT_TRUE(h200.has_value());
  EXPECT_EQ(datasheet_peak_gflops(*h200, DType::bf16), 989.5e3);
  EXPECT_EQ(datasheet_peak_gflops(*h200, DType::f32), 67.0e3);
  EXPECT_FALSE(datasheet_peak_gflops(*h200, DType::f16).has_value());
  // training.allow_tf32: fp32 GEMMs measured against the TF32 tensor-core figure; bf16 unchanged.
  EXPECT_EQ(datasheet_peak_gflops(*h200, DType::f32, true), 494.5e3);
  EXPECT_EQ(datasheet_peak_gflops(*h200, DType::bf16, true), 989.5e3);
  const std::optional<DatasheetPeak> h100 = datasheet_peak("NVIDIA H100 80GB HBM3", 9, 0);
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(datasheet_peak_gflops(*h100, DType::bf16), 989.5e3);
  const std::optional<DatasheetPeak> a100 = datasheet_peak("NVIDIA A100-SXM4-80GB", 8, 0);
  ASSERT_TRUE(a100.has_value());
  EXPECT_EQ(datasheet_peak_gflops(*a100, DType::bf16), 312.0e3);
  EXPECT_EQ(datasheet_peak_gflops(*a100, DType::f32), 19.5e3);
  EXPECT_EQ(datasheet_peak_gflops(*a100, DType::f32, true), 156.0e3);
  // The PCIe H100 runs at another clock: not guessed from the SXM's row.
  EXPECT_FALSE(datasheet_peak("NVIDIA H100 PCIe", 9, 0).has_value());
  EXPECT_FALSE(datasheet_peak("NVIDIA H200", 8, 0).has_value());
  EXPECT_FALSE(datasheet_peak("NVIDIA H200 NVL", 9, 0).has_value());
}

TEST(Backend, CpuHasNoDeviceMemoryCountOfItsOwn) {
  EXPECT_FALSE(device_memory_in_use(cpu_backend()).has_value());
}

TEST(Backend, CpuMemoryAndThreadsAreTheMachines) {
  EXPECT_GT(cpu_backend().memory_bytes(), 0u);
  EXPECT_EQ(cpu_backend().memory_bytes(), cpu_info().memory_bytes);
  const int saved = thread_count();
  set_thread_count(3);
  EXPECT_EQ(cpu_backend().threads(), 3);
  set_thread_count(saved);
  EXPECT_EQ(cpu_backend().threads(), saved);
}

}  // namespace
}  // namespace titan
