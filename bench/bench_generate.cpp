// Generation speed of a Qwen3 model with the Qwen3-0.6B dims and random weights, with fp32 and
// with bf16 weights, each with an fp32 and a bf16 KV cache, against ceilings measured in the same
// run:
//   prefill (512 tokens) GFLOP/s vs the GEMM ceiling of the weights' dtype (fp32:
//           measure_gemm_ceiling_gflops; bf16, whose GEMMs take bf16 operands:
//           measure_gemm_bf16_ceiling_gflops), measured just before and after it (the higher)
//   decode  (batch 1, after the prompt: at depth 512 + the tokens so far) tokens/s vs memory
//           bandwidth / bytes read per token (the weights in their dtype and the KV cache at that
//           depth in its dtype), twice: in segments of 32 tokens with the best of five 1 GiB
//           passes between them, and step by step with one 256 MiB pass between every two steps
//           (decode_step_by_step says why the second is the bound of the step's own moment)
//   titan generate's time to first token (prefill and the first token's choice)
// and, with --transformers PYTHON, Transformers' CPU generate on the same model exported in that
// dtype (loaded with that torch dtype, so its static cache is in it too; batch 1, 512-token
// prompt, 128 new tokens, greedy) with the titan / HF ratios of new tokens/s and of time to
// first token. First, one lm_head-sized matrix-vector product three ways: titan's fp32 and bf16
// GEMV and the fp32 GEMM (gemm_f32) with M = 1 (why fp32 decode uses the GEMV).
//
// Like titan generate, it re-executes itself with OMP_WAIT_POLICY=passive and a short
// GOMP_SPINCOUNT when neither is set (reexec_with_short_omp_spin); --omp-wait libgomp keeps
// libgomp's defaults instead, and a policy or spin count set in the environment is kept.
//
// --export DIR measures nothing: it writes the model as Hugging Face folders DIR/float32 and
// DIR/bfloat16 (those of --dtype) and exits, for another engine to run the same weights
// (bench/llama_cpp_compare.sh). The random init is seeded, so every run builds the same model.
//
// usage: bench_generate [--layers N] [--prompt 512] [--new 128] [--threads N]
//                       [--dtype both|float32|bfloat16] [--kv-cache both|float32|bfloat16]
//                       [--omp-wait short|libgomp] [--transformers PYTHON] [--dir DIR]
//                       [--export DIR]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/threads.h"
#include "titan/backend/cpu/vec.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/infer/generate.h"
#include "titan/infer/sampling.h"
#include "titan/infer/session.h"
#include "titan/infer/weights.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/ops/gemv.h"
#include "titan/ops/linear.h"

namespace titan {
namespace {

using titan::bench::now_seconds;

// Read bandwidth in GB/s over a buffer far larger than the caches: threaded sums, the access
// pattern of a GEMV streaming its weights. The sums are the vector primitive of this CPU's ISA
// (sum_squares), as the GEMV rows are: a scalar-compiled loop here can fall short of the memory
// and make the bound too easy.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(int64_t bytes)
      : n_(bytes / static_cast<int64_t>(sizeof(float)) / kBlock * kBlock),
        buf_(host_memory(), static_cast<size_t>(n_) * sizeof(float), MemCategory::other) {
    float* x = buf_.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_; ++i) x[i] = 1.0f;
  }

  // The fastest of `passes` passes over the buffer.
  double best_gbs(int passes) {
    const VecKernels& v = vec();
    const float* x = buf_.as<float>();
    double best = 0.0;
    for (int rep = 0; rep < passes; ++rep) {
      const double t0 = now_seconds();
      double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
      for (int64_t b = 0; b < n_; b += kBlock) total += v.sum_squares(x + b, kBlock);
      const double dt = now_seconds() - t0;
      sink_ += total;
      best = std::max(best, static_cast<double>(n_) * sizeof(float) / dt * 1e-9);
    }
    return best;
  }

  ~ReadBandwidthProbe() {
    if (sink_ < 0) std::printf("%f", sink_);  // keeps the sums observable
  }

 private:
  static constexpr int64_t kBlock = 4096;
  int64_t n_;
  Buffer buf_;
  double sink_ = 0.0;
};

// The best of five passes over 1 GiB: the highest rate the memory gives in that second.
double measure_read_bandwidth_gbs() {
  ReadBandwidthProbe probe(int64_t{1} << 30);
  return probe.best_gbs(5);
}

// Bytes of weights one decode step reads: every linear weight of every layer and the lm_head in
// `linear_dtype`; the norm weights and one embedding row, always fp32.
double weight_bytes_per_token(const ModelArgs& a, DType linear_dtype) {
  const double h = a.hidden_size, qd = a.num_attention_heads * a.head_dim;
  const double kvd = a.num_key_value_heads * a.head_dim, I = a.intermediate_size;
  const double linear = a.num_hidden_layers * (h * qd * 2 + h * kvd * 2 + 3 * h * I) +
                        static_cast<double>(a.vocab_size) * h;
  const double fp32 = a.num_hidden_layers * (2 * h + 2 * a.head_dim) + h + h;
  return linear * static_cast<double>(dtype_size(linear_dtype)) + fp32 * 4;
}

// An lm_head-sized (V, h) product with one token, best of five, in GB/s of weights read:
// titan's GEMV with fp32 and bf16 weights, and the fp32 GEMM (gemm_f32) with M = 1.
void compare_gemv(const ModelArgs& a) {
  const int64_t rows = a.vocab_size, cols = a.hidden_size;
  Buffer w32(host_memory(), static_cast<size_t>(rows * cols) * sizeof(float), MemCategory::other);
  Buffer w16(host_memory(), static_cast<size_t>(rows * cols) * sizeof(uint16_t),
             MemCategory::other);
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * cols; ++i) {
    w32.as<float>()[i] = static_cast<float>(i % 7) * 0.01f;
    w16.as<uint16_t>()[i] = f32_to_bf16(w32.as<float>()[i]);
  }
  const auto best_gbs = [&](double bytes, const auto& run) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = now_seconds();
      run();
      best = std::min(best, now_seconds() - t0);
    }
    return bytes / best * 1e-9;
  };
  const double f32_bytes = static_cast<double>(rows * cols) * 4, bf16_bytes = f32_bytes / 2;
  const GemvProduct f32{{DType::f32, w32.data(), rows, cols}, y.data()};
  const GemvProduct bf16{{DType::bf16, w16.data(), rows, cols}, y.data()};
  const double gemv_f32 = best_gbs(f32_bytes, [&] { gemv_forward({&f32, 1}, x.data()); });
  const double gemv_bf16 = best_gbs(bf16_bytes, [&] { gemv_forward({&bf16, 1}, x.data()); });
  const double gemm = best_gbs(
      f32_bytes, [&] { linear_forward(y.data(), x.data(), w32.as<float>(), 1, cols, rows); });
  std::printf(
      "lm_head GEMV (%lld x %lld), GB/s of weights: titan fp32 %.1f, titan bf16 %.1f, "
      "fp32 GEMM M=1 %.1f (read bandwidth now %.1f)\n",
      static_cast<long long>(rows), static_cast<long long>(cols), gemv_f32, gemv_bf16, gemm,
      measure_read_bandwidth_gbs());
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
                          const std::vector<int32_t>& prompt, int64_t n_new, int threads,
                          DType dtype) {
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
                          std::to_string(threads) + " --dtype " + torch_dtype_name(dtype);
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

// Bytes of the KV cache one decode step reads with `depth` positions cached (its own included):
// every layer's keys and values.
double kv_cache_bytes(const ModelArgs& a, int64_t depth, DType cache) {
  return 2.0 * static_cast<double>(a.num_hidden_layers * a.num_key_value_heads * a.head_dim) *
         static_cast<double>(depth) * static_cast<double>(dtype_size(cache));
}

std::string setup_name(DType weights, DType cache) {
  return torch_dtype_name(weights) + " weights, " + torch_dtype_name(cache) + " cache";
}

// The same decode held to the bandwidth of its own moment: one pass over 256 MiB (well past the
// last-level cache) between every two steps, each step held to the faster of the two passes
// around it. A pass takes 5-10 ms and a step 25-90 ms, so both see the same state of the VM's
// memory, which moves between ~22 and ~55 GB/s within a second. bench_setup's segments hold 32
// steps to the best of five 1 GiB passes on either side, the highest rate of two moments a
// second or more apart, which a decode streaming at the memory's speed of its own moment then
// falls short of (docs/PERFORMANCE.md, "Decode against the bandwidth of its moment").
void decode_step_by_step(const InferenceWeights& weights, DType cache,
                         const std::vector<int32_t>& prompt, int64_t n_new) {
  const ModelArgs& args = weights.model().args();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const double weight_bytes = weight_bytes_per_token(args, weights.dtype());
  ReadBandwidthProbe probe(int64_t{256} << 20);
  InferenceSession session(weights, n_prompt + n_new, n_prompt, cache);
  int32_t id = argmax(session.forward(prompt.data(), n_prompt), args.vocab_size);
  const int64_t first_depth = session.length() + 1;
  double bandwidth_before = probe.best_gbs(1), read = 0.0, movable = 0.0, seconds = 0.0;
  std::vector<double> ratios;                // per step
  for (int64_t i = 0; i + 1 < n_new; ++i) {  // the last new token is never fed back
    const double t0 = now_seconds();
    id = argmax(session.forward(&id, 1), args.vocab_size);
    const double step = now_seconds() - t0;
    const double bandwidth_after = probe.best_gbs(1);
    const double bytes = weight_bytes + kv_cache_bytes(args, session.length(), cache);
    const double can_move = std::max(bandwidth_before, bandwidth_after) * 1e9 * step;
    ratios.push_back(bytes / can_move);
    read += bytes;
    movable += can_move;
    seconds += step;
    bandwidth_before = bandwidth_after;
  }
  TITAN_CHECK(!ratios.empty(), "--new ", n_new, ": decode needs at least 2 new tokens");
  std::sort(ratios.begin(), ratios.end());
  const auto percentile = [&](size_t p) { return 100.0 * ratios[(ratios.size() - 1) * p / 100]; };
  std::printf(
      "[%s] decode at depth %lld-%lld, bandwidth measured between steps: %.2f tokens/s = %.0f%% "
      "of the bandwidth bound (bar 80%%; steps' 10th, 50th, 90th percentile %.0f, %.0f, %.0f%%)\n",
      setup_name(weights.dtype(), cache).c_str(), static_cast<long long>(first_depth),
      static_cast<long long>(session.length()), static_cast<double>(ratios.size()) / seconds,
      100.0 * read / movable, percentile(10), percentile(50), percentile(90));
}

struct TitanTiming {
  double ttft = 0.0, seconds = 0.0;  // titan generate's time to first token, and end to end
};

// Prefill, decode and titan generate for one weight and cache dtype.
TitanTiming bench_setup(const InferenceWeights& weights, DType cache,
                        const std::vector<int32_t>& prompt, int64_t n_new) {
  const ModelArgs& args = weights.model().args();
  const DType dtype = weights.dtype();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const std::string name = setup_name(dtype, cache);
  const bool bf16 = dtype == DType::bf16;
  const auto ceiling_gflops = [&] {
    return bf16 ? measure_gemm_bf16_ceiling_gflops() : measure_gemm_ceiling_gflops();
  };

  // Each ceiling is measured just before and just after the run it bounds, and the higher taken:
  // on this shared VM the ceilings move 2x within a minute as other jobs come and go, so a
  // ceiling from another moment would make the ratio meaningless either way. bf16 weights run
  // bf16 GEMMs: their bound is the bf16 GEMM ceiling.
  const double ceiling_before = ceiling_gflops();
  // Prefill alone, best of three (the first call also warms the caches and thread pool).
  double prefill = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    InferenceSession session(weights, n_prompt + n_new, n_prompt, cache);
    const double t0 = now_seconds();
    session.forward(prompt.data(), n_prompt);
    prefill = std::min(prefill, now_seconds() - t0);
  }
  const double prefill_gflops = prefill_flops(args, n_prompt) / prefill * 1e-9;
  const double ceiling_after = ceiling_gflops();
  const double ceiling = std::max(ceiling_before, ceiling_after);
  std::printf(
      "[%s] prefill %lld tokens: %.3f s, %.0f tokens/s, %.1f GFLOP/s = %.0f%% of the %s GEMM "
      "ceiling %.1f GFLOP/s (bar %s; ceiling %.1f before, %.1f after)\n",
      name.c_str(), static_cast<long long>(n_prompt), prefill, n_prompt / prefill, prefill_gflops,
      100.0 * prefill_gflops / ceiling, bf16 ? "bf16" : "fp32", ceiling, bf16 ? "60%" : "50%",
      ceiling_before, ceiling_after);

  // Decode alone (greedy, the session's one-token calls), in segments of kSegment tokens with the
  // read bandwidth measured between them, each segment bounded by the higher of the two around
  // it: the VM's bandwidth switches between ~35 and ~60 GB/s within seconds, so one ceiling for
  // the whole decode would compare most of its tokens against another moment's machine. A step
  // reads every weight once and the whole KV cache so far (its own row included); the ratio is
  // the bytes the decoded tokens read over the bytes the bandwidth moves in the same time,
  // segment by segment.
  constexpr int64_t kSegment = 32;
  const double weight_bytes = weight_bytes_per_token(args, dtype);
  InferenceSession session(weights, n_prompt + n_new, n_prompt, cache);
  int32_t id = argmax(session.forward(prompt.data(), n_prompt), args.vocab_size);
  double bandwidth_before = measure_read_bandwidth_gbs(), decode_seconds = 0.0;
  double read = 0.0, movable = 0.0;
  double worst = 1e30, best = 0.0, bandwidth_low = 1e30, bandwidth_high = 0.0;
  int64_t decoded = 0;
  const int64_t first_depth = session.length() + 1;
  while (decoded + kSegment <= n_new - 1) {  // the last new token is never fed back
    double bytes = 0.0;
    const double t0 = now_seconds();
    for (int64_t i = 0; i < kSegment; ++i) {
      id = argmax(session.forward(&id, 1), args.vocab_size);
    }
    const double seconds = now_seconds() - t0;
    for (int64_t depth = session.length() - kSegment + 1; depth <= session.length(); ++depth) {
      bytes += weight_bytes + kv_cache_bytes(args, depth, cache);
    }
    const double bandwidth_after = measure_read_bandwidth_gbs();
    const double can_move = std::max(bandwidth_before, bandwidth_after) * 1e9 * seconds;
    worst = std::min(worst, bytes / can_move);
    best = std::max(best, bytes / can_move);
    bandwidth_low = std::min({bandwidth_low, bandwidth_before, bandwidth_after});
    bandwidth_high = std::max({bandwidth_high, bandwidth_before, bandwidth_after});
    decoded += kSegment;
    decode_seconds += seconds;
    read += bytes;
    movable += can_move;
    bandwidth_before = bandwidth_after;
  }
  TITAN_CHECK(decoded > 0, "--new ", n_new, ": decode needs at least ", kSegment + 1,
              " new tokens (one segment)");
  std::printf(
      "[%s] decode at depth %lld-%lld: %.2f tokens/s = %.0f%% of the bandwidth bound (bar 80%%; "
      "%lld segments of %lld tokens: %.0f-%.0f%%): %.3f GB of weights + %.1f-%.1f MB of KV cache "
      "per token, read bandwidth %.1f-%.1f GB/s\n",
      name.c_str(), static_cast<long long>(first_depth), static_cast<long long>(session.length()),
      decoded / decode_seconds, 100.0 * read / movable, static_cast<long long>(decoded / kSegment),
      static_cast<long long>(kSegment), 100.0 * worst, 100.0 * best, weight_bytes * 1e-9,
      kv_cache_bytes(args, first_depth, cache) * 1e-6,
      kv_cache_bytes(args, session.length(), cache) * 1e-6, bandwidth_low, bandwidth_high);

  decode_step_by_step(weights, cache, prompt, n_new);

  GenerateOptions options;
  options.max_new_tokens = n_new;  // no eos ids: exactly n_new tokens, like HF's min_new_tokens
  options.kv_cache_dtype = cache;
  const GenerateResult r = generate_tokens(weights, prompt, options);
  const double titan_total = r.time_to_first_token + r.decode_seconds;
  std::printf(
      "[%s] titan generate %lld + %lld tokens: %.2f s end to end, %.2f new tokens/s, time to "
      "first token %.0f ms\n",
      name.c_str(), static_cast<long long>(n_prompt), static_cast<long long>(r.ids.size()),
      titan_total, r.ids.size() / titan_total, r.time_to_first_token * 1e3);
  return {r.time_to_first_token, titan_total};
}

// One weight dtype: every cache dtype's prefill, decode and time to first token, then (with
// `python`) Transformers' generate on the same weights in that dtype (its cache in that dtype
// too, as torch keeps it).
void bench_dtype(CausalLM& model, const std::vector<DType>& caches,
                 const std::vector<int32_t>& prompt, int64_t n_new, const std::string& python,
                 const std::string& dir, int threads) {
  const DType dtype = model.compute_dtype();
  const InferenceWeights weights(model);
  std::vector<TitanTiming> titan;
  for (const DType cache : caches) titan.push_back(bench_setup(weights, cache, prompt, n_new));
  if (python.empty()) return;

  // The folder holds the weights rounded to `dtype`: the values titan's bf16 copies hold.
  const std::string name = torch_dtype_name(dtype);
  HfExportOptions export_options;
  export_options.dtype = dtype;
  export_options.overwrite = true;
  export_hf_folder(dir, model, export_options);
  const HfTiming hf = run_transformers(python, dir, prompt, n_new, threads, dtype);
  std::printf(
      "[%s] transformers generate (torch_dtype=%s): %.2f s end to end, %.2f new tokens/s, time "
      "to first token %.0f ms\n",
      name.c_str(), name.c_str(), hf.seconds, n_new / hf.seconds, hf.ttft * 1e3);
  for (size_t i = 0; i < caches.size(); ++i) {
    std::printf(
        "[%s] titan / transformers: new tokens/s %.2fx (bar 1.5x), time to first token %.2fx "
        "(bar at most 1x)\n",
        setup_name(dtype, caches[i]).c_str(), hf.seconds / titan[i].seconds,
        titan[i].ttft / hf.ttft);
  }
  std::filesystem::remove_all(dir);
}

int run(int argc, char** argv) {
  int64_t layers = -1, n_prompt = 512, n_new = 128;
  int threads = default_thread_count();
  std::string python, dtypes = "both", caches = "both", omp_wait = "short", export_dir;
  std::string dir = (std::filesystem::temp_directory_path() / "titan_bench_generate");
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
    else if (arg == "--dtype")
      dtypes = value;
    else if (arg == "--kv-cache")
      caches = value;
    else if (arg == "--omp-wait")
      omp_wait = value;
    else if (arg == "--transformers")
      python = value;
    else if (arg == "--dir")
      dir = value;
    else if (arg == "--export")
      export_dir = value;
    else
      fail("unknown argument ", arg);
  }
  TITAN_CHECK(omp_wait == "short" || omp_wait == "libgomp", "--omp-wait ", omp_wait,
              ": expected short or libgomp");
  if (omp_wait == "short") reexec_with_short_omp_spin(argv);
  std::vector<DType> run_dtypes = {DType::f32, DType::bf16};
  if (dtypes == "float32" || dtypes == "bfloat16") {
    run_dtypes = {dtypes == "float32" ? DType::f32 : DType::bf16};
  } else {
    TITAN_CHECK(dtypes == "both", "--dtype ", dtypes, ": expected both, float32 or bfloat16");
  }
  std::vector<DType> run_caches = {DType::f32, DType::bf16};
  if (caches == "float32" || caches == "bfloat16") {
    run_caches = {caches == "float32" ? DType::f32 : DType::bf16};
  } else {
    TITAN_CHECK(caches == "both", "--kv-cache ", caches, ": expected both, float32 or bfloat16");
  }
  set_thread_count(threads);
  ModelArgs args = flavor("0.6B");
  if (layers > 0) args.num_hidden_layers = layers;
  const auto env_or_unset = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "(unset)";
  };
  std::printf(
      "model: Qwen3-0.6B dims, %lld layers, random init; %d threads; OMP_WAIT_POLICY=%s "
      "GOMP_SPINCOUNT=%s\n",
      static_cast<long long>(args.num_hidden_layers), threads, env_or_unset("OMP_WAIT_POLICY"),
      env_or_unset("GOMP_SPINCOUNT"));

  if (!export_dir.empty()) {
    DecoderLM model(args);
    model.initialize(1);
    for (DType dtype : run_dtypes) {
      const std::string folder = export_dir + "/" + torch_dtype_name(dtype);
      HfExportOptions export_options;
      export_options.dtype = dtype;
      export_hf_folder(folder, model, export_options);
      std::printf("exported %s\n", folder.c_str());
    }
    return 0;
  }

  compare_gemv(args);
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (int64_t i = 0; i < n_prompt; ++i) prompt[i] = static_cast<int32_t>((i * 7919) % 151643);
  for (DType dtype : run_dtypes) {
    // The same weights in either dtype: bf16 runs on the model's own rounded compute copies.
    DecoderLM model(args, {}, dtype);
    model.initialize(1);
    bench_dtype(model, run_caches, prompt, n_new, python, dir, threads);
  }
  return 0;
}

}  // namespace
}  // namespace titan

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_generate", titan::run, argc, argv);
}
