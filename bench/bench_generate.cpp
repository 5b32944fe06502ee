// Generation speed of a Qwen3 model with the Qwen3-0.6B dims and random weights, against the
// ceilings measured in this same run:
//   decode  (batch 1) tokens/s vs memory bandwidth / bytes of weights read per token
//   prefill (512 tokens) GFLOP/s vs the fp32 GEMM ceiling (measure_gemm_peak_gflops)
// and, with --transformers PYTHON, Transformers' CPU generate on the same exported folder (fp32,
// batch 1, 512-token prompt, 128 new tokens, greedy, static cache) with the titan / HF ratio.
//
// usage: bench_generate [--layers N] [--prompt 512] [--new 128] [--threads N]
//                       [--transformers PYTHON] [--dir DIR]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "titan/backend/cpu/gemm.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/core/threads.h"
#include "titan/infer/generate.h"
#include "titan/infer/session.h"
#include "titan/models/flavors.h"
#include "titan/models/hf_export.h"
#include "titan/nn/qwen3.h"

namespace titan {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Read bandwidth in GB/s: the best of several threaded sums over a buffer far larger than the
// caches, the access pattern of a GEMV streaming its weights.
double measure_read_bandwidth_gbs() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of floats
  Buffer buf(static_cast<size_t>(n) * sizeof(float), MemCategory::other);
  float* x = buf.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  double best = 0.0, sink = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_seconds();
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t b = 0; b < n; b += 4096) {
      float acc[16] = {};
      for (int64_t i = b; i < b + 4096; i += 16) {
        for (int k = 0; k < 16; ++k) acc[k] += x[i + k];
      }
      for (float a : acc) total += a;
    }
    const double dt = now_seconds() - t0;
    sink += total;
    best = std::max(best, static_cast<double>(n) * sizeof(float) / dt * 1e-9);
  }
  if (sink < 0) std::printf("%f", sink);  // keeps the sums observable
  return best;
}

// Bytes of weights one decode step reads: every linear and norm weight of every layer, the final
// norm, the lm_head, and one embedding row.
double weight_bytes_per_token(const ModelArgs& a, int64_t bytes_per_weight) {
  const double h = a.hidden_size, qd = a.num_attention_heads * a.head_dim;
  const double kvd = a.num_key_value_heads * a.head_dim, I = a.intermediate_size;
  const double layer = h * qd * 2 + h * kvd * 2 + 3 * h * I + 2 * h + 2 * a.head_dim;
  return (a.num_hidden_layers * layer + h + a.vocab_size * h + h) * bytes_per_weight;
}

// Forward FLOPs of a prefill of T tokens that keeps only the last position's logits: the layer
// GEMMs over all tokens, causal attention (q k^T and p v over the visible half), one lm_head row.
double prefill_flops(const ModelArgs& a, int64_t T) {
  const double h = a.hidden_size, qd = a.num_attention_heads * a.head_dim;
  const double kvd = a.num_key_value_heads * a.head_dim, I = a.intermediate_size;
  const double linear = 2.0 * T * (h * qd * 2 + h * kvd * 2 + 3 * h * I);
  const double attention = 2.0 * 2.0 * qd * (static_cast<double>(T) * (T + 1) / 2);
  return a.num_hidden_layers * (linear + attention) + 2.0 * h * a.vocab_size;
}

struct HfTiming {
  double seconds = 0.0, ttft = 0.0;
};

HfTiming run_transformers(const std::string& python, const std::string& folder,
                          const std::vector<int32_t>& prompt, int64_t n_new, int threads) {
  const std::string ids_path = folder + "/bench_prompt.json";
  {
    std::ofstream out(ids_path);
    out << "[";
    for (size_t i = 0; i < prompt.size(); ++i) out << (i ? "," : "") << prompt[i];
    out << "]";
  }
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  const std::string script =
      std::string(src != nullptr ? src : ".") + "/bench/generate_transformers.py";
  const std::string cmd = "'" + python + "' '" + script + "' --model '" + folder + "' --prompt '" +
                          ids_path + "' --new " + std::to_string(n_new) + " --threads " +
                          std::to_string(threads);
  FILE* pipe = popen(cmd.c_str(), "r");
  TITAN_CHECK(pipe != nullptr, "cannot run ", cmd);
  HfTiming t;
  char line[512];
  bool found = false;
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    if (std::sscanf(line, "seconds %lf ttft %lf", &t.seconds, &t.ttft) == 2) found = true;
  }
  TITAN_CHECK(pclose(pipe) == 0 && found, "the Transformers run failed: ", cmd);
  return t;
}

int run(int argc, char** argv) {
  int64_t layers = -1, n_prompt = 512, n_new = 128;
  int threads = default_thread_count();
  std::string python, dir = (std::filesystem::temp_directory_path() / "titan_bench_generate");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    TITAN_CHECK(i + 1 < argc, arg, " needs a value");
    const std::string value = argv[++i];
    if (arg == "--layers")
      layers = std::stoll(value);
    else if (arg == "--prompt")
      n_prompt = std::stoll(value);
    else if (arg == "--new")
      n_new = std::stoll(value);
    else if (arg == "--threads")
      threads = std::stoi(value);
    else if (arg == "--transformers")
      python = value;
    else if (arg == "--dir")
      dir = value;
    else
      fail("unknown argument ", arg);
  }
  set_thread_count(threads);
  ModelArgs args = flavor("0.6B");
  if (layers > 0) args.num_hidden_layers = layers;
  std::printf("model: Qwen3-0.6B dims, %lld layers, fp32 weights, random init; %d threads\n",
              static_cast<long long>(args.num_hidden_layers), threads);

  const double bandwidth = measure_read_bandwidth_gbs();
  const double ceiling = measure_gemm_peak_gflops();
  std::printf("measured: read bandwidth %.1f GB/s, fp32 GEMM ceiling %.1f GFLOP/s\n", bandwidth,
              ceiling);

  Qwen3Model model(args);
  model.initialize(1);
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (int64_t i = 0; i < n_prompt; ++i) prompt[i] = static_cast<int32_t>((i * 7919) % 151643);

  // Prefill alone, best of three (the first call also warms the caches and thread pool).
  double prefill = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    InferenceSession session(model, n_prompt + n_new, n_prompt);
    const double t0 = now_seconds();
    session.forward(prompt.data(), n_prompt);
    prefill = std::min(prefill, now_seconds() - t0);
  }
  const double prefill_gflops = prefill_flops(args, n_prompt) / prefill * 1e-9;
  std::printf(
      "prefill %lld tokens: %.3f s, %.0f tokens/s, %.1f GFLOP/s = %.0f%% of the GEMM "
      "ceiling (bar 50%%)\n",
      static_cast<long long>(n_prompt), prefill, n_prompt / prefill, prefill_gflops,
      100.0 * prefill_gflops / ceiling);

  GenerateOptions options;
  options.max_new_tokens = n_new;  // no eos ids: exactly n_new tokens, like HF's min_new_tokens
  const GenerateResult r = generate_tokens(model, prompt, options);
  const double decode_rate = (static_cast<double>(r.ids.size()) - 1) / r.decode_seconds;
  const double bytes = weight_bytes_per_token(args, 4);
  const double bound = bandwidth * 1e9 / bytes;
  std::printf(
      "decode: %.2f tokens/s; bound %.2f tokens/s (%.2f GB of weights per token) -> "
      "%.0f%% of the bandwidth bound (bar 60%%)\n",
      decode_rate, bound, bytes * 1e-9, 100.0 * decode_rate / bound);
  const double titan_total = r.time_to_first_token + r.decode_seconds;
  std::printf(
      "titan generate %lld + %lld tokens: %.2f s end to end, %.2f new tokens/s, time to "
      "first token %.0f ms\n",
      static_cast<long long>(n_prompt), static_cast<long long>(r.ids.size()), titan_total,
      r.ids.size() / titan_total, r.time_to_first_token * 1e3);

  if (!python.empty()) {
    HfExportOptions export_options;
    export_options.dtype = DType::f32;
    export_options.overwrite = true;
    export_hf_folder(dir, model, export_options);
    const HfTiming hf = run_transformers(python, dir, prompt, n_new, threads);
    std::printf(
        "transformers generate: %.2f s end to end, %.2f new tokens/s, time to first "
        "token %.0f ms\n",
        hf.seconds, n_new / hf.seconds, hf.ttft * 1e3);
    std::printf("titan / transformers new tokens/s: %.2fx (bar 1.5x)\n", hf.seconds / titan_total);
    std::filesystem::remove_all(dir);
  }
  return 0;
}

}  // namespace
}  // namespace titan

int main(int argc, char** argv) {
  try {
    return titan::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: error: %s\n", e.what());
    return 1;
  }
}
