// Decode speed on CUDA against the HBM bound (issue 41's bar: at least 50 %): a model folder (the
// device check writes one of Qwen3-0.6B's dims with random weights through Transformers) loaded
// with bf16 weights and a bf16 KV cache on the GPU, a prompt of --prompt ids (512) prefilled in
// one call, then --new greedy tokens (128) one step at a time, as titan generate --device cuda
// runs them (InferenceSession: the GEMVs, the cache in device memory, one row of logits copied to
// the host for the choice). The bound is the bytes a step must read -- every matmul weight once
// in bf16 (the lm_head included; the embedding's one row not counted), the norms' fp32 weights,
// and the KV cache at the step's depth, averaged over the steps -- over --copy-rate, the device
// copy rate bench_cuda_gemm measures (GB/s, bytes read plus written). Prints one line each for the
// prefill, the decode and the fraction of the bound.
// usage: bench_cuda_decode --model DIR --copy-rate GBPS [--prompt 512] [--new 128]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_main.h"
#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/infer/sampling.h"
#include "titan/infer/session.h"
#include "titan/infer/weights.h"

namespace titan {
namespace {

// Bytes one decode step reads at cache depth `depth` (bf16 weights and cache).
double step_bytes(const ModelArgs& a, int64_t depth) {
  const double h = static_cast<double>(a.hidden_size), hd = static_cast<double>(a.head_dim);
  const double q = a.num_attention_heads * hd, kv = a.num_key_value_heads * hd;
  const double per_layer = h * (q + 2 * kv) + q * h + 3.0 * h * a.intermediate_size;
  const double matmuls = a.num_hidden_layers * per_layer + h * a.vocab_size;
  const double norms = a.num_hidden_layers * (2.0 * h + 2.0 * hd) + h;
  const double cache = 2.0 * a.num_hidden_layers * static_cast<double>(depth) * kv;
  return 2.0 * matmuls + 4.0 * norms + 2.0 * cache;
}

int run(int argc, char** argv) {
  std::string model;
  double copy_rate = 0.0;
  int64_t prompt = 512, fresh = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model = value;
    } else if (flag == "--copy-rate") {
      copy_rate = std::atof(value.c_str());
    } else if (flag == "--prompt") {
      prompt = std::atoll(value.c_str());
    } else if (flag == "--new") {
      fresh = std::atoll(value.c_str());
    } else {
      fail("unknown flag ", flag, " (usage: --model DIR --copy-rate GBPS [--prompt N] [--new N])");
    }
  }
  TITAN_CHECK(!model.empty() && copy_rate > 0.0 && prompt >= 1 && fresh >= 2,
              "usage: bench_cuda_decode --model DIR --copy-rate GBPS [--prompt N >= 1] [--new N "
              ">= 2]");
  select_backend("cuda");
  std::printf("%s\n", backend().name().c_str());
  const std::unique_ptr<InferenceWeights> weights = InferenceWeights::load(model, DType::bf16);
  const ModelArgs& a = weights->model().args();
  InferenceSession session(*weights, prompt + fresh, prompt, DType::bf16);
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  uint32_t x = 12345u;
  for (int32_t& id : ids) {
    x = x * 1664525u + 1013904223u;
    id = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(a.vocab_size));
  }
  const double t0 = bench::now_seconds();
  int32_t next = argmax(session.forward(ids.data(), prompt), a.vocab_size);
  const double t1 = bench::now_seconds();
  // The first step after the prompt is a warm-up (the GEMV's first launch); the rest are timed.
  next = argmax(session.forward(&next, 1), a.vocab_size);
  const double t2 = bench::now_seconds();
  double bytes = 0.0;
  for (int64_t s = 1; s < fresh; ++s) {
    bytes += step_bytes(a, session.length() + 1);
    next = argmax(session.forward(&next, 1), a.vocab_size);  // logits copied back: synchronous
  }
  const double seconds = bench::now_seconds() - t2;
  const double steps = static_cast<double>(fresh - 1);
  const double rate = steps / seconds, bound = copy_rate * 1e9 * steps / bytes;
  std::printf("prefill: %lld tokens in %.1f ms (%.0f tokens/s)\n", static_cast<long long>(prompt),
              (t1 - t0) * 1e3, static_cast<double>(prompt) / (t1 - t0));
  std::printf(
      "decode: %.0f steps after the prompt at %.1f tokens/s (%.3f ms/token, %.1f MB read "
      "per token)\n",
      steps, rate, seconds / steps * 1e3, bytes / steps * 1e-6);
  std::printf(
      "HBM bound at %.0f GB/s: %.1f tokens/s; decode at %.1f %% of it (issue 41's bar: "
      ">= 50 %%)\n",
      copy_rate, bound, 100.0 * rate / bound);
  return 0;
}

}  // namespace
}  // namespace titan

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_cuda_decode", titan::run, argc, argv);
}
