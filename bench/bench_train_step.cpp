// One training step -- forward, backward, AdamW -- of a Qwen3 model on random tokens, timed.
// Prints tokens/s, model GFLOP/s (docs/PERFORMANCE.md gives the formula), MFU against the GEMM
// ceiling of the compute dtype measured in this same run, and peak memory by category against
// what the design must keep. With --torch it also times the same step in PyTorch eager
// (Transformers' Qwen3, fp32 weights, sdpa attention, torch.optim.AdamW; with --dtype bfloat16
// under torch.autocast("cpu", bfloat16)) in the same run and prints the ratio.
//
// With --pairs N it instead runs an fp32 and a bf16 model side by side, N pairs of alternating
// steps, and prints the fp32 / bf16 ratio of each pair and their median (run_pairs).
//
// usage: bench_train_step [--config small|0.6b-4l|tiny] [--steps N] [--threads N]
//                         [--dtype float32|bfloat16] [--torch PYTHON] [--pairs N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/flops.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/ops/adamw.h"

namespace titan {
namespace {

using titan::bench::now_seconds;

struct BenchConfig {
  std::string name;
  ModelArgs args;
  int64_t batch = 0, seq = 0;
};

BenchConfig make_config(const std::string& name) {
  BenchConfig c;
  c.name = name;
  ModelArgs& a = c.args;
  a.vocab_size = 151936;
  a.head_dim = 128;
  a.tie_word_embeddings = true;
  if (name == "small") {
    a.hidden_size = 512, a.intermediate_size = 2048, a.num_hidden_layers = 8;
    a.num_attention_heads = 8, a.num_key_value_heads = 4;
    c.batch = 4, c.seq = 512;
  } else if (name == "0.6b-4l") {
    a.hidden_size = 1024, a.intermediate_size = 3072, a.num_hidden_layers = 4;
    a.num_attention_heads = 16, a.num_key_value_heads = 8;
    c.batch = 1, c.seq = 512;
  } else if (name == "tiny") {
    // The default `titan train` run's model and shape: the trainer's overhead is measured
    // against this.
    a = flavor("tiny");
    c.batch = 8, c.seq = 256;
  } else {
    fail("--config: unknown config '", name, "' (small, 0.6b-4l or tiny)");
  }
  return c;
}

double gib(size_t bytes) {
  return static_cast<double>(bytes) / (1u << 30);
}

struct Timing {
  double seconds_per_step = 0.0;
  double tokens_per_second = 0.0;
  // PyTorch only: the process's peak resident memory, and what it held before the first step.
  double peak_rss_gib = 0.0, before_steps_gib = 0.0;
};

// One model in `compute`, its batch and AdamW: step(index) runs one training step, timed.
class TrainStepper {
 public:
  TrainStepper(const BenchConfig& c, DType compute)
      : c_(c), model_(c.args, {}, compute), ids_(static_cast<size_t>(c.batch * c.seq)) {
    model_.initialize(0);
    model_.allocate_gradients();
    for (ParamGroup& g : model_.param_groups()) g.allocate_optimizer_state();
    Rng rng(1);
    for (int32_t& id : ids_) id = static_cast<int32_t>(rng.next_u64() % c.args.vocab_size);
  }

  double step(int64_t index) {
    const double t0 = now_seconds();
    model_.zero_gradients();
    ForwardOptions options;
    options.compute_grad = true;
    options.grad_scale = 1.0f / static_cast<float>(c_.batch * (c_.seq - 1));
    model_.forward(ids_.data(), ids_.data(), c_.batch, c_.seq, options);
    model_.backward();
    const AdamWScalars s = adamw_scalars(adamw_, adamw_.lr, index);
    for (ParamGroup& g : model_.param_groups()) {
      adamw_update(g.params(), g.grads(), g.exp_avg(), g.exp_avg_sq(), g.numel(), s);
    }
    return now_seconds() - t0;
  }

  const DecoderLM& model() const { return model_; }

 private:
  const BenchConfig& c_;
  DecoderLM model_;
  std::vector<int32_t> ids_;
  AdamWConfig adamw_;
};

Timing run_titan(const BenchConfig& c, int steps, DType compute) {
  TrainStepper stepper(c, compute);
  const DecoderLM& model = stepper.model();
  const int64_t n = c.batch * c.seq;
  stepper.step(1);  // warm-up: first-touch page faults, oneDNN kernel selection
  double best = 1e30;
  for (int i = 0; i < steps; ++i) best = std::min(best, stepper.step(2 + i));
  const MemoryStats mem = memory_stats();
  // fp32 weights, gradients and AdamW moments; bf16 compute adds the matmul weights' bf16 copies.
  const size_t param_bytes = static_cast<size_t>(model.parameter_count()) * 4;
  const size_t must_keep = 4 * param_bytes + mem.peak[static_cast<int>(MemCategory::parameters)] -
                           param_bytes +
                           static_cast<size_t>(model.activation_bytes(c.batch, c.seq));
  std::printf("  memory peak %.2f GiB vs %.2f GiB the design must keep (ratio %.2f)\n",
              gib(mem.total_peak), gib(must_keep),
              static_cast<double>(mem.total_peak) / static_cast<double>(must_keep));
  std::printf("    by category (peak): ");
  for (int k = 0; k < kMemCategoryCount; ++k) {
    std::printf("%s %.2f GiB%s",
                std::string(mem_category_name(static_cast<MemCategory>(k))).c_str(),
                gib(mem.peak[k]), k + 1 < kMemCategoryCount ? ", " : "\n");
  }
  return {best, static_cast<double>(n) / best};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// fp32 and bf16 side by side in one process, their steps alternating (which goes first alternates
// too), so that the machine's drift -- on a shared VM, +-10 % between runs minutes apart -- falls
// on both alike; the ratio is taken pair by pair. Memory is not reported: both models share the
// process.
void run_pairs(const BenchConfig& c, int pairs) {
  const double flops =
      training_flops_per_token(c.args, c.seq) * static_cast<double>(c.batch * c.seq);
  const double f32_before = measure_gemm_ceiling_gflops();
  const double bf16_before = measure_gemm_bf16_ceiling_gflops();
  TrainStepper fp32(c, DType::f32), bf16(c, DType::bf16);
  fp32.step(1);  // warm-ups
  bf16.step(1);
  std::vector<double> t32, t16, ratios;
  for (int i = 0; i < pairs; ++i) {
    const bool fp32_first = i % 2 == 0;
    const double first = fp32_first ? fp32.step(2 + i) : bf16.step(2 + i);
    const double second = fp32_first ? bf16.step(2 + i) : fp32.step(2 + i);
    t32.push_back(fp32_first ? first : second);
    t16.push_back(fp32_first ? second : first);
    ratios.push_back(t32.back() / t16.back());
    std::printf("pair %2d: fp32 %.3f s  bf16 %.3f s  fp32/bf16 %.3fx\n", i + 1, t32.back(),
                t16.back(), ratios.back());
  }
  const double f32_ceiling = std::max(f32_before, measure_gemm_ceiling_gflops());
  const double bf16_ceiling = std::max(bf16_before, measure_gemm_bf16_ceiling_gflops());
  std::printf(
      "GEMM ceilings (2048^3, the higher of before and after the steps): fp32 %.1f, bf16 %.1f "
      "GFLOP/s (bf16 / fp32 %.2fx)\n",
      f32_ceiling, bf16_ceiling, bf16_ceiling / f32_ceiling);
  const double m32 = median(t32), m16 = median(t16);
  std::printf("median step: fp32 %.3f s (%.1f%% of its ceiling), bf16 %.3f s (%.1f%% of its)\n",
              m32, 100.0 * flops / m32 * 1e-9 / f32_ceiling, m16,
              100.0 * flops / m16 * 1e-9 / bf16_ceiling);
  std::printf("fp32 / bf16 step time over %d pairs: median %.3fx (min %.3f, max %.3f)\n", pairs,
              median(ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
}

Timing run_torch(const std::string& python, const BenchConfig& c, int steps, int threads,
                 DType compute) {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  const std::string script = std::string(src != nullptr ? src : ".") + "/bench/torch_train_step.py";
  const ModelArgs& a = c.args;
  const std::string cmd =
      python + " " + script + " --hidden " + std::to_string(a.hidden_size) + " --intermediate " +
      std::to_string(a.intermediate_size) + " --layers " + std::to_string(a.num_hidden_layers) +
      " --heads " + std::to_string(a.num_attention_heads) + " --kv-heads " +
      std::to_string(a.num_key_value_heads) + " --head-dim " + std::to_string(a.head_dim) +
      " --vocab " + std::to_string(a.vocab_size) + " --batch " + std::to_string(c.batch) +
      " --seq " + std::to_string(c.seq) + " --steps " + std::to_string(steps) + " --threads " +
      std::to_string(threads) + (compute == DType::bf16 ? " --autocast-bf16" : "");
  FILE* pipe = popen(cmd.c_str(), "r");
  TITAN_CHECK(pipe != nullptr, "cannot run ", cmd);
  double seconds = -1.0, peak = -1.0, before = -1.0;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::sscanf(line, "seconds_per_step %lf", &seconds);
    std::sscanf(line, "peak_rss_gib %lf before_steps_gib %lf", &peak, &before);
  }
  const int status = pclose(pipe);
  TITAN_CHECK(status == 0 && seconds > 0 && peak > 0, "PyTorch reference failed (", cmd, ")");
  return {seconds, static_cast<double>(c.batch * c.seq) / seconds, peak, before};
}

int run(int argc, char** argv) {
  std::string config_name = "small", python, dtype = "float32";
  int steps = 3, threads = default_thread_count(), pairs = 0;
  bool paired = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    TITAN_CHECK(i + 1 < argc, arg, " needs a value");
    if (arg == "--config")
      config_name = argv[++i];
    else if (arg == "--steps")
      steps = std::atoi(argv[++i]);
    else if (arg == "--threads")
      threads = std::atoi(argv[++i]);
    else if (arg == "--torch")
      python = argv[++i];
    else if (arg == "--dtype")
      dtype = argv[++i];
    else if (arg == "--pairs")
      pairs = std::atoi(argv[++i]), paired = true;
    else
      fail("unknown argument '", arg, "'");
  }
  TITAN_CHECK(steps >= 1, "--steps must be at least 1");
  TITAN_CHECK(!paired || pairs >= 1, "--pairs must be at least 1");
  TITAN_CHECK(dtype == "float32" || dtype == "bfloat16", "--dtype: '", dtype,
              "' is not float32 or bfloat16");
  const DType compute = dtype == "bfloat16" ? DType::bf16 : DType::f32;
  set_thread_count(threads);
  const BenchConfig c = make_config(config_name);
  const auto ceiling_gflops = [&] {
    return compute == DType::bf16 ? measure_gemm_bf16_ceiling_gflops()
                                  : measure_gemm_ceiling_gflops();
  };
  // Measured before and after titan's steps, the higher taken (as bench_generate does): another
  // job on this shared machine can halve one measurement, which made a step "167 % of the
  // ceiling".
  const double flops = training_flops_per_token(c.args, c.seq);
  std::printf(
      "config %s: hidden %lld, layers %lld, heads %lld/%lld, head_dim %lld, "
      "intermediate %lld, vocab %lld, batch %lld x seq %lld, threads %d\n",
      c.name.c_str(), (long long)c.args.hidden_size, (long long)c.args.num_hidden_layers,
      (long long)c.args.num_attention_heads, (long long)c.args.num_key_value_heads,
      (long long)c.args.head_dim, (long long)c.args.intermediate_size, (long long)c.args.vocab_size,
      (long long)c.batch, (long long)c.seq, threads);
  std::printf("model FLOPs per token: %.3f GFLOP\n", flops * 1e-9);
  if (paired) {
    TITAN_CHECK(python.empty(), "--pairs times titan alone; --torch takes --dtype");
    run_pairs(c, pairs);
    return 0;
  }
  const double ceiling_before = ceiling_gflops();
  const Timing titan = run_titan(c, steps, compute);
  const double ceiling_after = ceiling_gflops();
  const double ceiling = std::max(ceiling_before, ceiling_after);
  std::printf(
      "%s GEMM ceiling (2048^3, this run): %.1f GFLOP/s (%.1f before the steps, %.1f after)\n",
      compute == DType::bf16 ? "bf16 (fp32 accumulation)" : "fp32", ceiling, ceiling_before,
      ceiling_after);
  const double titan_gflops = titan.tokens_per_second * flops * 1e-9;
  std::printf("titan   %.3f s/step  %.1f tokens/s  %.1f GFLOP/s  MFU %.1f%% of the ceiling\n",
              titan.seconds_per_step, titan.tokens_per_second, titan_gflops,
              100.0 * titan_gflops / ceiling);
  if (!python.empty()) {
    const Timing torch = run_torch(python, c, steps, threads, compute);
    const double torch_gflops = torch.tokens_per_second * flops * 1e-9;
    std::printf("pytorch %.3f s/step  %.1f tokens/s  %.1f GFLOP/s  MFU %.1f%% of the ceiling\n",
                torch.seconds_per_step, torch.tokens_per_second, torch_gflops,
                100.0 * torch_gflops / ceiling);
    std::printf("  pytorch peak resident memory %.2f GiB, %.2f GiB before its first step\n",
                torch.peak_rss_gib, torch.before_steps_gib);
    std::printf("titan / pytorch tokens/s: %.2fx\n",
                titan.tokens_per_second / torch.tokens_per_second);
  }
  return 0;
}

}  // namespace
}  // namespace titan

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_train_step", titan::run, argc, argv);
}
