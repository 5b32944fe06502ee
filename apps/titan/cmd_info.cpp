#include <algorithm>
#include <cstdio>
#include <string>

#include "commands.h"
#include "model_folder.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/peak.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/models/hf_info.h"

namespace titan::cli {
namespace {

int print_device() {
  const CpuInfo& cpu = cpu_info();
  std::printf("device        cpu\n");
  std::printf("model         %s\n", cpu.model_name.c_str());
  std::printf("isa           %s (avx2 %s, avx512 %s, avx512_bf16 %s, amx_bf16 %s)\n",
              isa_name(active_isa()), cpu.avx2 ? "yes" : "no", cpu.avx512 ? "yes" : "no",
              cpu.avx512_bf16 ? "yes" : "no", cpu.amx_bf16 ? "yes" : "no");
  std::printf("cores         %d physical, %d logical\n", cpu.physical_cores, cpu.logical_cpus);
  std::printf("threads       %d\n", thread_count());
  std::printf("memory        %.1f GiB\n", static_cast<double>(cpu.memory_bytes) / (1u << 30));
  std::printf("gemm          %s\n", gemm_library_name().c_str());
  std::printf("gemm bf16     %s\n", gemm_bf16_library_name().c_str());
  const CpuPeak& peak = cpu_peak();
  const int cores = std::min(thread_count(), cpu.logical_cpus);
  std::printf(
      "peak fp32     %.1f GFLOP/s for %d threads, the MFU denominator (per core %.1f: %.3f GHz x "
      "%d FMA/cycle x %d lanes x 2; %s)\n",
      cpu_peak_fp32_gflops(thread_count()), cores, peak.fp32_gflops_per_core(), peak.clock_ghz,
      peak.fma_per_cycle, peak.fp32_lanes, peak.source.c_str());
  char amx[128];
  std::snprintf(amx, sizeof amx,
                "per core %.1f: %.3f GHz x %d FLOP/cycle, AMX bf16 tile dot products",
                peak.bf16_gflops_per_core(), peak.clock_ghz, peak.amx_flops_per_cycle);
  std::printf("peak bf16     %.1f GFLOP/s for %d threads (%s)\n",
              cpu_peak_bf16_gflops(thread_count()), cores,
              peak.bf16_unit == Bf16Unit::amx ? amx
              : peak.bf16_unit == Bf16Unit::avx512_bf16
                  ? "AVX512_BF16 dot products, twice the fp32 rate"
                  : "no native bf16: widened to fp32, the fp32 rate");
  std::printf(
      "gemm ceiling  %.1f GFLOP/s (best 2048^3 sgemm measured now; not the MFU denominator)\n",
      measure_gemm_ceiling_gflops());
  return 0;
}

// 1234567 -> "1,234,567"
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

// 1234567 -> "1.23 MB (1,234,567 bytes)"
std::string bytes_str(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000 && unit < 4) {
    value /= 1000;
    ++unit;
  }
  char text[96];
  std::snprintf(text, sizeof text, "%.2f %s (%s bytes)", value, units[unit],
                grouped(static_cast<int64_t>(bytes)).c_str());
  return text;
}

void print_model_folder(const std::string& path) {
  const ModelFolder folder(path, "titan info");
  const HfFolderInfo info = inspect_hf_folder(folder.path());
  const ModelArgs& a = info.args;
  if (const std::optional<TrainerState>& state = folder.checkpoint()) {
    std::printf("checkpoint    %s: titan training checkpoint of step %lld, %s\n", path.c_str(),
                static_cast<long long>(state->step),
                state->model_only ? "model weights only" : "with its optimizer state");
    std::printf("as exported   (fp32, by titan convert %s DST)\n", path.c_str());
  } else {
    std::printf("folder        %s\n", info.dir.c_str());
  }
  std::printf("architecture  %s\n", a.architecture.c_str());
  std::printf("layers        %lld\n", static_cast<long long>(a.num_hidden_layers));
  std::printf("heads         %lld query, %lld key/value, head_dim %lld\n",
              static_cast<long long>(a.num_attention_heads),
              static_cast<long long>(a.num_key_value_heads), static_cast<long long>(a.head_dim));
  std::printf("hidden        %lld\n", static_cast<long long>(a.hidden_size));
  if (a.is_moe()) {
    int64_t sparse = 0;
    for (int64_t i = 0; i < a.num_hidden_layers; ++i) sparse += a.layer_is_sparse(i) ? 1 : 0;
    std::printf("experts       %lld, %lld per token, width %lld, in %lld of %lld layers\n",
                static_cast<long long>(a.num_experts),
                static_cast<long long>(a.num_experts_per_tok),
                static_cast<long long>(a.moe_intermediate_size), static_cast<long long>(sparse),
                static_cast<long long>(a.num_hidden_layers));
    if (sparse < a.num_hidden_layers) {
      std::printf("intermediate  %lld (dense layers)\n",
                  static_cast<long long>(a.intermediate_size));
    }
  } else {
    std::printf("intermediate  %lld\n", static_cast<long long>(a.intermediate_size));
  }
  std::printf("vocab         %lld\n", static_cast<long long>(a.vocab_size));
  std::printf("parameters    %s total, %s without embeddings", grouped(info.counts.total).c_str(),
              grouped(info.counts.non_embedding()).c_str());
  if (a.is_moe()) std::printf(", %s active per token", grouped(info.counts.active).c_str());
  std::printf("\n");
  std::printf("embeddings    %s\n",
              a.tie_word_embeddings
                  ? (info.tied_lm_head_stored ? "tied (lm_head.weight stored too, equal)"
                                              : "tied (no lm_head.weight)")
                  : "untied (lm_head.weight)");
  std::string dtypes;
  for (const auto& [name, n] : info.dtype_tensors) {
    dtypes += (dtypes.empty() ? "" : ", ") + name + " x " + std::to_string(n);
  }
  std::printf("dtype         %s\n", dtypes.c_str());
  std::printf("tensors       %zu, %s of data\n", info.tensors, bytes_str(info.data_bytes).c_str());
  std::printf("shards        %zu\n", info.shards);
  for (const HfFolderInfo::File& f : info.weight_files) {
    std::printf("  %-36s %s\n", f.name.c_str(), bytes_str(f.bytes).c_str());
  }
  std::string others;
  for (const std::string& name : info.other_files) others += (others.empty() ? "" : ", ") + name;
  std::printf("other files   %s\n", others.empty() ? "none" : others.c_str());
}

}  // namespace

Action add_info_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "info",
      "describe a Hugging Face model folder or titan step-N checkpoint (PATH) or this machine "
      "(--device)");
  static int threads;
  static bool device = false;
  static std::string path;
  add_threads_option(*command, threads);
  command->add_flag("--device", device, "ISA, cores, threads, GEMM library, peak GFLOP/s");
  command->add_option("path", path,
                      "model folder: architecture, dims, parameter counts, dtypes, files");
  return [] {
    set_thread_count(threads);
    TITAN_CHECK(device || !path.empty(),
                "nothing to show (usage: titan info PATH | titan info --device [--threads N])");
    if (!path.empty()) print_model_folder(path);
    return device ? print_device() : 0;
  };
}

}  // namespace titan::cli
