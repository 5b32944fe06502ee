#include <cstdio>

#include "commands.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/core/cpu_info.h"
#include "titan/core/error.h"
#include "titan/core/threads.h"

namespace titan::cli {
namespace {

int print_device() {
  const CpuInfo& cpu = cpu_info();
  std::printf("device        cpu\n");
  std::printf("model         %s\n", cpu.model_name.c_str());
  std::printf("isa           %s (avx2 %s, avx512 %s, avx512_bf16 %s)\n", isa_name(active_isa()),
              cpu.avx2 ? "yes" : "no", cpu.avx512 ? "yes" : "no", cpu.avx512_bf16 ? "yes" : "no");
  std::printf("cores         %d physical, %d logical\n", cpu.physical_cores, cpu.logical_cpus);
  std::printf("threads       %d\n", thread_count());
  std::printf("memory        %.1f GiB\n", static_cast<double>(cpu.memory_bytes) / (1u << 30));
  std::printf("gemm          %s\n", gemm_library_name().c_str());
  std::printf("peak fp32     %.1f GFLOP/s (measured 2048^3 sgemm; the MFU denominator)\n",
              measure_gemm_peak_gflops());
  return 0;
}

}  // namespace

Action add_info_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("info", "describe this machine (--device)");
  static int threads;
  static bool device = false;
  add_threads_option(*command, threads);
  command->add_flag("--device", device, "ISA, cores, threads, GEMM library, peak GFLOP/s");
  return [] {
    set_thread_count(threads);
    TITAN_CHECK(device, "nothing to show (usage: titan info --device [--threads N])");
    return print_device();
  };
}

}  // namespace titan::cli
