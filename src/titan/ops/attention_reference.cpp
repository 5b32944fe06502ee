// The attention reference (ops/attention.h): the full probability matrix per query, fp64 sums.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/ops/attention.h"

namespace titan {

void attention_forward_reference(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& s) {
  attention_check_shape(s);
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t offset = s.seq_kv - s.seq_q;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> prob(s.seq_kv);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const float* qi = q + ((b * s.seq_q + i) * H + h) * hd;
        const int64_t visible = offset + i + 1;
        const int64_t first = s.segment_start == nullptr ? 0 : s.segment_start[b * s.seq_q + i];
        double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t j = first; j < visible; ++j) {
          const float* kj = k + ((b * s.seq_kv + j) * KV + h / G) * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          prob[j] = dot * scale;
          m = std::max(m, prob[j]);
        }
        for (int64_t j = first; j < visible; ++j) sum += (prob[j] = std::exp(prob[j] - m));
        float* o = out + ((b * s.seq_q + i) * H + h) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = first; j < visible; ++j) {
            acc += prob[j] * v[((b * s.seq_kv + j) * KV + h / G) * hd + d];
          }
          o[d] = static_cast<float>(acc / sum);
        }
        lse[(b * H + h) * s.seq_q + i] = static_cast<float>(m + std::log(sum));
      }
    }
  }
}

void attention_forward_reference_bf16_kv(float* out, float* lse, const float* q, const uint16_t* k,
                                         const uint16_t* v, const AttentionShape& s) {
  attention_check_shape(s);
  const size_t n = static_cast<size_t>(s.batch * s.seq_kv * s.n_kv_heads * s.head_dim);
  std::vector<float> k32(n), v32(n);
  for (size_t i = 0; i < n; ++i) {
    k32[i] = bf16_to_f32(k[i]);
    v32[i] = bf16_to_f32(v[i]);
  }
  attention_forward_reference(out, lse, q, k32.data(), v32.data(), s);
}

void attention_backward_reference(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, const AttentionShape& s) {
  attention_check_shape(s);
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t offset = s.seq_kv - s.seq_q;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::fill(dq, dq + s.batch * s.seq_q * H * hd, 0.0f);
  std::fill(dk, dk + s.batch * s.seq_kv * KV * hd, 0.0f);
  std::fill(dv, dv + s.batch * s.seq_kv * KV * hd, 0.0f);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t qrow = ((b * s.seq_q + i) * H + h) * hd;
        double delta = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          delta += static_cast<double>(dout[qrow + d]) * out[qrow + d];
        const int64_t first = s.segment_start == nullptr ? 0 : s.segment_start[b * s.seq_q + i];
        for (int64_t j = first; j <= offset + i; ++j) {
          const int64_t krow = ((b * s.seq_kv + j) * KV + h / G) * hd;
          double score = 0.0, dprob = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            score += static_cast<double>(q[qrow + d]) * k[krow + d];
            dprob += static_cast<double>(dout[qrow + d]) * v[krow + d];
          }
          const double prob = std::exp(score * scale - lse[(b * H + h) * s.seq_q + i]);
          const double dscore = prob * (dprob - delta) * scale;
          for (int64_t d = 0; d < hd; ++d) {
            dv[krow + d] += static_cast<float>(prob * dout[qrow + d]);
            dq[qrow + d] += static_cast<float>(dscore * k[krow + d]);
            dk[krow + d] += static_cast<float>(dscore * q[qrow + d]);
          }
        }
      }
    }
  }
}

}  // namespace titan
