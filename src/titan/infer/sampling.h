// Choosing the next token from logits the way Hugging Face generate() does: the repetition
// penalty over the whole sequence so far, then, when sampling, the warpers in HF's order
// temperature -> top-k -> top-p -> min-p, a softmax and one draw from a seeded RNG. Greedy
// decoding is the argmax (first index on ties).
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/rng.h"

namespace titan {

struct SamplingParams {
  bool do_sample = false;           // false (or temperature 0): greedy
  double temperature = 1.0;         // > 0 when sampling; 0 means greedy
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // (0, 1]; 1: off
  double min_p = 0.0;               // [0, 1]; 0: off
  double repetition_penalty = 1.0;  // > 0; 1: off
};

// Throws titan::Error naming the first out-of-range field.
void validate_sampling_params(const SamplingParams& p);
bool is_greedy(const SamplingParams& p);

// HF RepetitionPenaltyLogitsProcessor: each distinct id of `context` has its logit divided by
// the penalty when positive and multiplied by it when negative. logits (V).
void apply_repetition_penalty(float* logits, int64_t vocab, const std::vector<int32_t>& context,
                              double penalty);
// HF's warpers in place on logits (V): removed tokens become -inf; at least one token is kept.
void apply_temperature(float* logits, int64_t vocab, double temperature);
void apply_top_k(float* logits, int64_t vocab, int64_t top_k);
void apply_top_p(float* logits, int64_t vocab, double top_p);
void apply_min_p(float* logits, int64_t vocab, double min_p);
// First index of the largest logit.
int32_t argmax(const float* logits, int64_t vocab);

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);
  // The next token after `context` (prompt and generated ids). logits (V) are modified.
  int32_t next(float* logits, int64_t vocab, const std::vector<int32_t>& context);

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<float> probs_;  // (V)
};

}  // namespace titan
