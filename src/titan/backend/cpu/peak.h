// The CPU's peak FLOP rate: the MFU denominator, taken the way torchtitan takes a GPU's -- what
// the hardware can issue, not what a benchmark reached at some moment -- so MFU cannot exceed
// 100 % and does not depend on what else ran when titan started (docs/TRAINING.md, "MFU").
//
// Per core: clock x vector FMA instructions per cycle x fp32 lanes x 2 FLOPs. The clock is timed
// on a chain of dependent integer adds (one cycle each on every x86-64 core; a busy memory bus
// does not slow it), the FMA rate on independent FMA chains of the widest vectors the CPU has;
// each is the best of many ~10 us trials, so a trial that another process or the hypervisor
// interrupted does not count. Measured once per machine and kept in the cache folder
// (core/cache_dir.h) as cpu-peak-v1.json, keyed by the CPU's model name and ISA.
#pragma once

#include <string>

namespace titan {

struct CpuPeak {
  double clock_ghz = 0.0;
  int fma_per_cycle = 0;     // vector FMA instructions a core completes per cycle
  int fp32_lanes = 0;        // of the widest vector ISA the CPU has
  bool native_bf16 = false;  // AVX512_BF16: a bf16 dot product does twice an FMA's FLOPs
  std::string source;        // "measured now" or the cache file it came from

  double fp32_gflops_per_core() const { return clock_ghz * fma_per_cycle * fp32_lanes * 2.0; }
  // bf16 with fp32 accumulation: twice the fp32 rate where the CPU has bf16 dot products,
  // otherwise the fp32 rate (bf16 is widened in registers).
  double bf16_gflops_per_core() const { return fp32_gflops_per_core() * (native_bf16 ? 2.0 : 1.0); }
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
