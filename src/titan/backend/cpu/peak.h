// The CPU's peak FLOP rate: the MFU denominator, taken the way torchtitan takes a GPU's -- what
// the hardware can issue, not what a benchmark reached at some moment -- so MFU cannot exceed
// 100 % and does not depend on what else ran when titan started (docs/TRAINING.md, "MFU").
//
// Per core: clock x FLOPs a cycle. fp32: vector FMA instructions per cycle x fp32 lanes x 2. The
// clock is timed on a chain of dependent register adds (one cycle each on every x86-64 core; a
// busy memory bus does not slow it), the FMA rate on independent FMA chains of the widest vectors
// the CPU has, the AMX rate on independent tile dot products; each is the best of many ~10 us
// trials, so a trial that another process or the hypervisor interrupted does not count. Measured
// once per machine and kept in the cache folder (core/cache_dir.h) as cpu-peak-v2.json, keyed by
// the CPU's model name and ISA.
#pragma once

#include <string>

namespace titan {

// What multiplies bf16 operands at the peak: AMX tiles (oneDNN's bf16 matmul runs on them where
// the CPU and the OS offer them), AVX512_BF16 dot products (twice an FMA's FLOPs), or nothing
// native (bf16 widened in registers, the fp32 rate).
enum class Bf16Unit { widened, avx512_bf16, amx };

struct CpuPeak {
  double clock_ghz = 0.0;
  int fma_per_cycle = 0;  // vector FMA instructions a core completes per cycle
  int fp32_lanes = 0;     // of the widest vector ISA the CPU has
  Bf16Unit bf16_unit = Bf16Unit::widened;
  int amx_flops_per_cycle = 0;  // TDPBF16PS FLOPs a core completes per cycle; 0 without AMX
  std::string source;           // "measured now" or the cache file it came from

  double fp32_flops_per_cycle() const { return fma_per_cycle * fp32_lanes * 2.0; }
  double bf16_flops_per_cycle() const {
    switch (bf16_unit) {
      case Bf16Unit::amx:
        return amx_flops_per_cycle;
      case Bf16Unit::avx512_bf16:
        return 2.0 * fp32_flops_per_cycle();
      case Bf16Unit::widened:
        break;
    }
    return fp32_flops_per_cycle();
  }
  bool native_bf16() const { return bf16_unit != Bf16Unit::widened; }
  double fp32_gflops_per_core() const { return clock_ghz * fp32_flops_per_cycle(); }
  double bf16_gflops_per_core() const { return clock_ghz * bf16_flops_per_cycle(); }
};

// Measured on the first call (about 10 ms) unless the cache holds this CPU's; then kept.
const CpuPeak& cpu_peak();
// The measurement itself, bypassing the cache.
CpuPeak measure_cpu_peak();
// The fp32 peak of `threads` cores (at most the CPU's logical count), in GFLOP/s.
double cpu_peak_fp32_gflops(int threads);
// The same for bf16 operands with fp32 accumulation.
double cpu_peak_bf16_gflops(int threads);

}  // namespace titan
