#include "titan/infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "titan/core/error.h"

namespace titan {
namespace {

constexpr float kRemoved = -std::numeric_limits<float>::infinity();

// Softmax of logits (V) into probs, in double sums; -inf logits get probability 0.
void softmax(std::vector<float>& probs, const float* logits, int64_t vocab) {
  probs.resize(static_cast<size_t>(vocab));
  const float max = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp(logits[i] - max);
    sum += probs[i];
  }
  for (float& p : probs) p = static_cast<float>(p / sum);
}

}  // namespace

void validate_sampling_params(const SamplingParams& p) {
  TITAN_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0,
              "temperature must be >= 0, got ", p.temperature);
  TITAN_CHECK(p.top_k >= 0, "top_k must be >= 0 (0: off), got ", p.top_k);
  TITAN_CHECK(p.top_p > 0.0 && p.top_p <= 1.0, "top_p must be in (0, 1], got ", p.top_p);
  TITAN_CHECK(p.min_p >= 0.0 && p.min_p <= 1.0, "min_p must be in [0, 1], got ", p.min_p);
  TITAN_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0,
              "repetition_penalty must be > 0, got ", p.repetition_penalty);
}

bool is_greedy(const SamplingParams& p) {
  return !p.do_sample || p.temperature == 0.0;
}

void apply_repetition_penalty(float* logits, int64_t vocab, const std::vector<int32_t>& context,
                              double penalty) {
  if (penalty == 1.0) return;
  std::unordered_set<int32_t> seen;  // each id once, as HF's gather/scatter does
  for (int32_t id : context) {
    if (id < 0 || id >= vocab || !seen.insert(id).second) continue;
    float& x = logits[id];
    x = x < 0.0f ? static_cast<float>(x * penalty) : static_cast<float>(x / penalty);
  }
}

void apply_temperature(float* logits, int64_t vocab, double temperature) {
  if (temperature == 1.0) return;
  const float t = static_cast<float>(temperature);
  for (int64_t i = 0; i < vocab; ++i) logits[i] /= t;
}

void apply_top_k(float* logits, int64_t vocab, int64_t top_k) {
  if (top_k <= 0 || top_k >= vocab) return;
  std::vector<float> sorted(logits, logits + vocab);
  std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                   std::greater<float>());
  const float kth = sorted[top_k - 1];
  // HF removes logits below the k-th largest: ties with it stay.
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] < kth) logits[i] = kRemoved;
  }
}

void apply_top_p(float* logits, int64_t vocab, double top_p) {
  if (top_p >= 1.0) return;
  std::vector<float> probs;
  softmax(probs, logits, vocab);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  // HF sorts ascending and removes the tokens whose cumulative probability is <= 1 - top_p,
  // always keeping the most likely one.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
  double cumulative = 0.0;
  for (int64_t r = 0; r + 1 < vocab; ++r) {
    cumulative += probs[order[r]];
    if (cumulative > 1.0 - top_p) break;
    logits[order[r]] = kRemoved;
  }
}

void apply_min_p(float* logits, int64_t vocab, double min_p) {
  if (min_p <= 0.0) return;
  std::vector<float> probs;
  softmax(probs, logits, vocab);
  const float threshold = static_cast<float>(min_p) * *std::max_element(probs.begin(), probs.end());
  // The most likely token always passes (its probability is the maximum).
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] < threshold) logits[i] = kRemoved;
  }
}

int32_t argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {
  validate_sampling_params(params_);
}

int32_t Sampler::next(float* logits, int64_t vocab, const std::vector<int32_t>& context) {
  apply_repetition_penalty(logits, vocab, context, params_.repetition_penalty);
  if (is_greedy(params_)) return argmax(logits, vocab);
  apply_temperature(logits, vocab, params_.temperature);
  apply_top_k(logits, vocab, params_.top_k);
  apply_top_p(logits, vocab, params_.top_p);
  apply_min_p(logits, vocab, params_.min_p);
  softmax(probs_, logits, vocab);
  // Inverse CDF of one uniform draw; rounding can leave u past the last sum, so fall back to the
  // last token with non-zero probability.
  const double u = rng_.uniform();
  double cumulative = 0.0;
  int32_t last_nonzero = argmax(logits, vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs_[i] == 0.0f) continue;
    cumulative += probs_[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < cumulative) return last_nonzero;
  }
  return last_nonzero;
}

}  // namespace titan
