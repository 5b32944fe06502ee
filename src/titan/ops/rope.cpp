#include "titan/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "titan/core/error.h"
#include "titan/ops/host_parallel.h"

namespace titan {
namespace {

// YaRN (Transformers' _compute_yarn_parameters): each frequency blended between itself and
// itself / factor by a ramp over the dims; cos and sin scaled by the attention factor.
void apply_yarn(const RopeParams& rope, std::vector<float>& inv_freq, float* attention_scaling) {
  const RopeScaling& yarn = rope.scaling;
  const int64_t hd = rope.head_dim;
  const double factor = yarn.factor;
  *attention_scaling = static_cast<float>(yarn.attention_factor > 0 ? yarn.attention_factor
                                                                    : 0.1 * std::log(factor) + 1.0);
  // Dimension index at which a frequency completes `rotations` turns over the original context.
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(hd) *
           std::log(static_cast<double>(yarn.original_max_position_embeddings) /
                    (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(rope.theta));
  };
  double low = std::max(std::floor(correction_dim(yarn.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(yarn.beta_slow)), static_cast<double>(hd - 1));
  if (low == high) high += 0.001;
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const float ramp =
        static_cast<float>(std::clamp((static_cast<double>(j) - low) / (high - low), 0.0, 1.0));
    const float extrapolation = inv_freq[j],
                interpolation = inv_freq[j] / static_cast<float>(factor);
    inv_freq[j] = interpolation * ramp + extrapolation * (1.0f - ramp);
  }
}

// Llama 3 (Transformers' _compute_llama3_parameters): wavelengths above the original context /
// low_freq_factor are divided by factor, those below original / high_freq_factor kept, and those
// between blended smoothly. Every step is one fp32 torch op with its scalars rounded to fp32, as
// HF runs it (`c / t` is t.reciprocal() * c there).
void apply_llama3(const RopeScaling& s, std::vector<float>& inv_freq) {
  const float factor = static_cast<float>(s.factor);
  const float low = static_cast<float>(s.low_freq_factor);
  const double context = static_cast<double>(s.original_max_position_embeddings);
  const float context_f = static_cast<float>(context);
  const float low_freq_wavelen = static_cast<float>(context / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(context / s.high_freq_factor);
  const float smooth_span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * M_PI);
  for (float& f : inv_freq) {
    const float wavelen = (1.0f / f) * two_pi;
    if (wavelen > low_freq_wavelen) {
      f = f / factor;
    } else if (wavelen >= high_freq_wavelen) {
      const float smooth = ((1.0f / wavelen) * context_f - low) / smooth_span;
      f = (1.0f - smooth) * f / factor + smooth * f;
    }
  }
}

// inv_freq (hd/2) as HF's RoPE variants compute it, in fp32; also the attention scaling.
std::vector<float> inverse_frequencies(const RopeParams& rope, float* attention_scaling) {
  const int64_t hd = rope.head_dim, half = hd / 2;
  const float base = static_cast<float>(rope.theta);
  std::vector<float> inv_freq(half);
  for (int64_t j = 0; j < half; ++j) {
    inv_freq[j] = 1.0f / std::pow(base, static_cast<float>(2 * j) / static_cast<float>(hd));
  }
  *attention_scaling = 1.0f;
  if (rope.scaling.type == "yarn") apply_yarn(rope, inv_freq, attention_scaling);
  if (rope.scaling.type == "llama3") apply_llama3(rope.scaling, inv_freq);
  return inv_freq;
}

void rotate(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
            int64_t n_heads, float sin_sign) {
  const int64_t half = cache.half_dim, hd = 2 * half;
  for (int64_t n = 0; n < n_tokens; ++n) {
    TITAN_CHECK(positions[n] >= 0 && positions[n] < cache.max_positions, "position ", positions[n],
                " at token ", n, " is outside the RoPE cache [0, ", cache.max_positions, ")");
  }
#pragma omp parallel for schedule(static) if (n_tokens * n_heads * hd >= kMinParallelElements)
  for (int64_t n = 0; n < n_tokens; ++n) {
    const float* c = cache.cos() + static_cast<int64_t>(positions[n]) * half;
    const float* s = cache.sin() + static_cast<int64_t>(positions[n]) * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* x1 = x + (n * n_heads + h) * hd;
      float* x2 = x1 + half;
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) {
        const float a = x1[j], b = x2[j], sj = sin_sign * s[j];
        x1[j] = a * c[j] - b * sj;
        x2[j] = b * c[j] + a * sj;
      }
    }
  }
}

}  // namespace

RopeCache rope_cache_build(const RopeParams& rope, int64_t max_positions) {
  TITAN_CHECK(max_positions > 0, "RoPE cache needs at least one position");
  float scaling = 1.0f;
  const std::vector<float> inv_freq = inverse_frequencies(rope, &scaling);
  RopeCache cache;
  cache.max_positions = max_positions;
  cache.half_dim = rope.head_dim / 2;
  cache.table =
      Buffer(host_memory(), sizeof(float) * static_cast<size_t>(2 * max_positions * cache.half_dim),
             MemCategory::other);
  float* c = cache.table.as<float>();
  float* s = c + max_positions * cache.half_dim;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t j = 0; j < cache.half_dim; ++j) {
      const float angle = static_cast<float>(p) * inv_freq[j];  // fp32 product, as HF
      c[p * cache.half_dim + j] = std::cos(angle) * scaling;
      s[p * cache.half_dim + j] = std::sin(angle) * scaling;
    }
  }
  return cache;
}

void rope_forward(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                  int64_t n_heads) {
  rotate(x, positions, cache, n_tokens, n_heads, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                   int64_t n_heads) {
  rotate(dx, positions, cache, n_tokens, n_heads, -1.0f);
}

void rope_forward_reference(float* x, const int32_t* positions, const RopeParams& rope,
                            int64_t n_tokens, int64_t n_heads) {
  float scaling = 1.0f;
  const std::vector<float> inv_freq = inverse_frequencies(rope, &scaling);
  const int64_t hd = rope.head_dim, half = hd / 2;
  std::vector<float> row(hd);
  for (int64_t n = 0; n < n_tokens; ++n) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xr = x + (n * n_heads + h) * hd;
      for (int64_t d = 0; d < hd; ++d) {
        const double angle =
            static_cast<double>(static_cast<float>(positions[n]) * inv_freq[d % half]);
        const double rotated = d < half ? -xr[d + half] : xr[d - half];
        row[d] = static_cast<float>(xr[d] * std::cos(angle) * scaling +
                                    rotated * std::sin(angle) * scaling);
      }
      std::copy(row.begin(), row.end(), xr);
    }
  }
}

}  // namespace titan
