#include "titan/backend/cpu/cpu_info.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "titan/core/error.h"

namespace titan {
namespace {

bool os_saves_avx512_state() {
  uint32_t eax, edx;
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0xe6) == 0xe6;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
}

bool os_saves_avx_state() {
  uint32_t eax, edx;
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0x6) == 0x6;
}

bool os_saves_amx_state() {
  uint32_t eax, edx;
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
}

// Linux hands the tile data state to a process only on request (5.16 and later); oneDNN asks the
// same way before it runs an AMX kernel.
bool os_permits_amx() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Distinct (physical id, core id) pairs; falls back to the logical count where /proc lacks them.
int count_physical_cores(int logical) {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, physical_id;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (line.rfind("physical id", 0) == 0) physical_id = value;
    if (line.rfind("core id", 0) == 0) cores.emplace(physical_id, value);
  }
  return cores.empty() ? logical : static_cast<int>(cores.size());
}

CpuInfo detect() {
  CpuInfo info;
  uint32_t a, b, c, d;
  const bool osxsave = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE);
  const bool fma = c & bit_FMA, f16c = c & bit_F16C;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && osxsave) {
    info.avx2 = (b & bit_AVX2) && fma && f16c && os_saves_avx_state();
    info.avx512 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) &&
                  (b & bit_AVX512DQ) && os_saves_avx512_state();
    constexpr uint32_t kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;  // GCC and Clang name them apart
    info.amx_bf16 = (d & kAmxBf16) && (d & kAmxTile) && os_saves_amx_state() && os_permits_amx();
  }
  if (info.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) info.avx512_bf16 = a & (1u << 5);

  info.logical_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  info.physical_cores = count_physical_cores(info.logical_cpus);
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      info.model_name = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    size_t kib = 0;
    meminfo >> kib;
    if (key == "MemTotal:") {
      info.memory_bytes = kib * 1024;
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
  return info;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::avx512_bf16:
      return "avx512_bf16";
  }
  return "?";
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

Isa active_isa() {
  static const Isa isa = [] {
    const char* env = std::getenv("TITAN_ISA");
    const std::vector<Isa> isas = supported_isas();
    if (env == nullptr || *env == '\0') return isas.back();
    const std::string want = env;
    for (const Isa candidate : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
      if (want != isa_name(candidate)) continue;
      TITAN_CHECK(std::find(isas.begin(), isas.end(), candidate) != isas.end(), "TITAN_ISA=", want,
                  ": this CPU has no ", want);
      return candidate;
    }
    fail("TITAN_ISA=", want, ": expected scalar, avx2, avx512 or avx512_bf16");
  }();
  return isa;
}

std::vector<Isa> supported_isas() {
  const CpuInfo& info = cpu_info();
  std::vector<Isa> isas = {Isa::scalar};
  if (info.avx2) isas.push_back(Isa::avx2);
  if (info.avx512) isas.push_back(Isa::avx512);
  if (info.avx512_bf16) isas.push_back(Isa::avx512_bf16);
  return isas;
}

}  // namespace titan
