#include "titan/backend/cpu/peak.h"

#include <unistd.h>

#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/vec.h"
#include "titan/core/cache_dir.h"
#include "titan/core/clock.h"

namespace titan {
namespace {

// 16 dependent adds per round: 16 cycles, the loop's own increment and branch issuing beside them.
// The addend is a register: Intel's cores from Golden Cove on fold chains of immediate adds at
// rename, and a chain of `add $1` timed a 4.2 GHz Sapphire Rapids at 22 GHz.
uint64_t add_chain(uint64_t x, int64_t rounds) {
  const uint64_t one = 1;
  for (int64_t r = 0; r < rounds; ++r) {
    asm volatile(
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
        : "+r"(x)
        : "r"(one)
        : "cc");
  }
  return x;
}

// AMX's tile configuration (palette 1): 16 rows of 64 bytes in each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

constexpr double kAmxFlopsPerDot = 16.0 * 16 * 32 * 2;  // 16 x 16 fp32 sums of 32 bf16 products

// `rounds` of 4 independent TDPBF16PS (tiles 0-3 accumulate, 4-7 hold the operands, zeros) --
// enough in flight to keep the tile unit busy. Needs cpu_info().amx_bf16.
__attribute__((target("amx-tile,amx-bf16"))) void amx_dot_chains(int64_t rounds) {
  static const TileConfig config;
  alignas(64) static const uint16_t zeros[16 * 32] = {};
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  for (int64_t r = 0; r < rounds; ++r) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_release();
}

// The shortest of `trials` timings of `run`: the trials nothing interrupted.
template <typename Run>
double best_seconds(int trials, Run run) {
  double best = 1e30;
  for (int t = 0; t < trials; ++t) {
    const double t0 = now_seconds();
    run();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

std::string cache_path() {
  return cache_dir("the CPU's peak FLOP rate") + "/cpu-peak-v2.json";
}

std::string cpu_key() {
  const CpuInfo& cpu = cpu_info();
  return cpu.model_name +
         (cpu.avx512 ? " avx512"
          : cpu.avx2 ? " avx2"
                     : " sse") +
         (cpu.avx512_bf16 ? " bf16" : "") + (cpu.amx_bf16 ? " amx" : "");
}

Bf16Unit bf16_unit_of(const CpuInfo& cpu) {
  return cpu.amx_bf16 ? Bf16Unit::amx : cpu.avx512_bf16 ? Bf16Unit::avx512_bf16 : Bf16Unit::widened;
}

// The cached peak of this CPU, if a readable cache file holds one.
bool read_cache(const std::string& path, CpuPeak& peak) {
  std::ifstream in(path);
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("cpu", "") != cpu_key()) return false;
  const double clock = j.value("clock_ghz", 0.0);
  const int fma = j.value("fma_per_cycle", 0), lanes = j.value("fp32_lanes", 0);
  const int amx = j.value("amx_flops_per_cycle", 0);
  const Bf16Unit unit = bf16_unit_of(cpu_info());
  if (!(clock > 0.1 && clock < 8.0) || fma < 1 || fma > 8 || lanes < 1 || lanes > 64 ||
      (unit == Bf16Unit::amx) != (amx > 0) || amx > 65536) {
    return false;
  }
  peak.clock_ghz = clock;
  peak.fma_per_cycle = fma;
  peak.fp32_lanes = lanes;
  peak.bf16_unit = unit;
  peak.amx_flops_per_cycle = amx;
  peak.source = path;
  return true;
}

// Best effort: a cache that cannot be written means measuring again next time, nothing worse.
void write_cache(const std::string& path, const CpuPeak& peak) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << nlohmann::json{{"cpu", cpu_key()},
                          {"clock_ghz", peak.clock_ghz},
                          {"fma_per_cycle", peak.fma_per_cycle},
                          {"fp32_lanes", peak.fp32_lanes},
                          {"amx_flops_per_cycle", peak.amx_flops_per_cycle}}
               .dump(2)
        << "\n";
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

CpuPeak measure_cpu_peak() {
  const CpuInfo& cpu = cpu_info();
  const VecKernels& widest = vec_kernels(cpu.avx512 ? Isa::avx512
                                         : cpu.avx2 ? Isa::avx2
                                                    : Isa::scalar);
  // A ~20 ms spin first, so a core that raises its clock under load has done so.
  volatile uint64_t sink = add_chain(0, 1 << 18);
  constexpr int64_t kAddRounds = 2048;  // 32k cycles
  const double add_s = best_seconds(300, [&] { sink = sink + add_chain(sink, kAddRounds); });
  const double clock_hz = 16.0 * kAddRounds / add_s;

  constexpr int64_t kFmaRounds = 2048;
  volatile float fsink = 0.0f;
  const double fma_s = best_seconds(300, [&] { fsink = fsink + widest.fma_chains(kFmaRounds); });
  const double fma_per_cycle = kFmaProbeChains * static_cast<double>(kFmaRounds) / fma_s / clock_hz;

  CpuPeak peak;
  peak.clock_ghz = clock_hz * 1e-9;
  peak.fma_per_cycle = std::max(1, static_cast<int>(std::lround(fma_per_cycle)));
  peak.fp32_lanes = widest.native_lanes;
  peak.bf16_unit = bf16_unit_of(cpu);
  if (peak.bf16_unit == Bf16Unit::amx) {
    // Sapphire Rapids completes one TDPBF16PS every 16 cycles (1024 FLOPs a cycle) and times at
    // about 0.9 of that against the add chain's clock; the issue rate is a power of two.
    constexpr int64_t kDotRounds = 512;  // 32k cycles
    const double dot_s = best_seconds(300, [&] { amx_dot_chains(kDotRounds); });
    const double flops_per_cycle = 4 * kDotRounds * kAmxFlopsPerDot / dot_s / clock_hz;
    peak.amx_flops_per_cycle =
        1 << std::max(0, static_cast<int>(std::lround(std::log2(flops_per_cycle))));
  }
  peak.source = "measured now";
  return peak;
}

const CpuPeak& cpu_peak() {
  static const CpuPeak peak = [] {
    const std::string path = cache_path();
    CpuPeak p;
    if (read_cache(path, p)) return p;
    p = measure_cpu_peak();
    write_cache(path, p);
    p.source = "measured now, cached in " + path;
    return p;
  }();
  return peak;
}

double cpu_peak_fp32_gflops(int threads) {
  return cpu_peak().fp32_gflops_per_core() * std::clamp(threads, 1, cpu_info().logical_cpus);
}

double cpu_peak_bf16_gflops(int threads) {
  return cpu_peak().bf16_gflops_per_core() * std::clamp(threads, 1, cpu_info().logical_cpus);
}

}  // namespace titan
