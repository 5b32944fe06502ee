#include "titan/ops/lora_dropout.h"

#include "titan/core/rng.h"
#include "titan/ops/host_parallel.h"

namespace titan {
namespace {

uint64_t token_key(const LoraDropoutCall& call, int64_t row, int64_t position) {
  return mix64(mix64(call.key ^ static_cast<uint64_t>(row)) ^ static_cast<uint64_t>(position));
}

bool keeps(uint64_t token, int64_t feature, double p) {
  const uint64_t bits = mix64(token ^ static_cast<uint64_t>(feature)) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53 >= p;
}

}  // namespace

bool lora_dropout_keeps(const LoraDropoutCall& call, int64_t row, int64_t position,
                        int64_t feature) {
  return keeps(token_key(call, row, position), feature, call.p);
}

void lora_dropout_apply(float* dst, const float* x, int64_t n, int64_t features,
                        const LoraDropoutCall& call, bool accumulate) {
  const float scale = static_cast<float>(1.0 / (1.0 - call.p));
#pragma omp parallel for schedule(static) if (n * features >= kMinParallelElements)
  for (int64_t t = 0; t < n; ++t) {
    const uint64_t token = token_key(call, call.first_row + t / call.seq_len, t % call.seq_len);
    const float* in = x + t * features;
    float* out = dst + t * features;
    for (int64_t f = 0; f < features; ++f) {
      const float kept = keeps(token, call.first_feature + f, call.p) ? in[f] * scale : 0.0f;
      out[f] = accumulate ? out[f] + kept : kept;
    }
  }
}

}  // namespace titan
