// What the CPU offers, detected once at start-up: instruction sets, cores, memory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace titan {

// avx512_bf16: AVX-512 with its bf16 dot product (vdpbf16ps), which the bf16 GEMV multiplies with.
enum class Isa { scalar, avx2, avx512, avx512_bf16 };
const char* isa_name(Isa isa);

struct CpuInfo {
  std::string model_name;
  bool avx2 = false;    // with FMA and F16C
  bool avx512 = false;  // F, BW, VL, DQ
  bool avx512_bf16 = false;
  // AMX tiles with bf16 dot products (TDPBF16PS), the OS saving their state and letting this
  // process use them; oneDNN's bf16 matmul runs on them where present.
  bool amx_bf16 = false;
  int logical_cpus = 1;
  int physical_cores = 1;
  size_t memory_bytes = 0;  // MemTotal
};

const CpuInfo& cpu_info();

// The vector ISA the kernels use: the best the CPU has, or TITAN_ISA=scalar|avx2|avx512|avx512_bf16
// when set (tests run every variant that way). Asking for an ISA the CPU lacks is an error.
Isa active_isa();
// Every ISA this CPU runs, scalar first.
std::vector<Isa> supported_isas();

}  // namespace titan
