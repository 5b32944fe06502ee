// Shared by the generate tests: a tiny random Qwen3 and the logits a full forward gives.
#pragma once

#include <cstdint>
#include <vector>

#include "tiny_models.h"
#include "titan/models/causal_lm.h"
#include "titan/models/model_args.h"

namespace titan::test {

// 2 layers, GQA with 2 query heads per kv head, head_dim != hidden / heads.
inline ModelArgs tiny_generate_args(bool tied, int64_t vocab = 97, int64_t max_positions = 256) {
  ModelArgs a = test::tiny_dense(tied);
  a.vocab_size = vocab;
  a.max_position_embeddings = max_positions;
  a.rope_theta = 10000.0;
  // Larger than HF's 0.02 so the logits are spread out: greedy choices are then far from ties
  // that fp32 rounding differences between implementations could flip.
  a.initializer_range = 0.2;
  return a;
}

// (S, V) logits of the full-sequence training forward.
inline std::vector<float> full_forward_logits(CausalLM& model, const std::vector<int32_t>& ids) {
  std::vector<float> logits(ids.size() * static_cast<size_t>(model.args().vocab_size));
  model.forward(ids.data(), nullptr, 1, static_cast<int64_t>(ids.size()),
                {.logits = logits.data()});
  return logits;
}

// Deterministic pseudo-random ids in [0, vocab).
inline std::vector<int32_t> test_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 12345u;
  for (int32_t& id : ids) {
    x = x * 1664525u + 1013904223u;
    id = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
  }
  return ids;
}

}  // namespace titan::test
