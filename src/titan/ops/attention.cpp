#include "titan/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/vec.h"
#include "titan/core/error.h"

namespace titan {
namespace {

constexpr int64_t kBlockQ = 128;
constexpr int64_t kBlockK = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys [0, visible) of a query at absolute position p are visible: visible = p + 1.
int64_t visible_in_block(int64_t query_pos, int64_t key0, int64_t block_cols) {
  return std::clamp<int64_t>(query_pos + 1 - key0, 0, block_cols);
}

}  // namespace

void attention_check_shape(const AttentionShape& s) {
  TITAN_CHECK(s.batch > 0 && s.seq_q > 0 && s.seq_kv > 0 && s.n_heads > 0 && s.n_kv_heads > 0 &&
                  s.head_dim > 0,
              "attention: every size must be positive (batch ", s.batch, ", seq_q ", s.seq_q,
              ", seq_kv ", s.seq_kv, ", heads ", s.n_heads, ", kv heads ", s.n_kv_heads,
              ", head_dim ", s.head_dim, ")");
  TITAN_CHECK(s.n_heads % s.n_kv_heads == 0, "attention: heads (", s.n_heads,
              ") must be a multiple of kv heads (", s.n_kv_heads, ")");
  TITAN_CHECK(s.seq_q <= s.seq_kv, "attention: more queries (", s.seq_q, ") than keys (", s.seq_kv,
              ")");
}

void attention_forward_blockwise(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& s) {
  attention_check_shape(s);
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd, offset = s.seq_kv - s.seq_q;
  const int64_t n_qblocks = (s.seq_q + kBlockQ - 1) / kBlockQ;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const VecKernels& vk = vec();
#pragma omp parallel
  {
    std::vector<float> scores(kBlockQ * kBlockK), acc(kBlockQ * hd), row_max(kBlockQ),
        row_sum(kBlockQ);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t qb = 0; qb < n_qblocks; ++qb) {
          const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, s.seq_q - i0);
          const float* q_blk = q + ((b * s.seq_q + i0) * H + h) * hd;
          const float* k_head = k + (b * s.seq_kv * KV + h / G) * hd;
          const float* v_head = v + (b * s.seq_kv * KV + h / G) * hd;
          std::fill(acc.begin(), acc.end(), 0.0f);
          std::fill(row_max.begin(), row_max.end(), kNegInf);
          std::fill(row_sum.begin(), row_sum.end(), 0.0f);
          const int64_t key_end = offset + i0 + rows;  // keys past the last query are masked
          for (int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
            const int64_t cols = std::min(kBlockK, key_end - j0);
            gemm_f32(Trans::no, Trans::yes, rows, cols, hd, scale, q_blk, ldq, k_head + j0 * ldk,
                     ldk, 0.0f, scores.data(), kBlockK);
            for (int64_t r = 0; r < rows; ++r) {
              float* sr = scores.data() + r * kBlockK;
              const int64_t visible = visible_in_block(offset + i0 + r, j0, cols);
              std::fill(sr + visible, sr + cols, 0.0f);
              if (visible == 0) continue;
              const float m_new = std::max(row_max[r], vk.max(sr, visible));
              const float correction = std::exp(row_max[r] - m_new);  // 0 on the first block
              row_sum[r] = row_sum[r] * correction + vk.exp_shift_sum(sr, sr, visible, m_new);
              if (correction != 1.0f) vk.scale(acc.data() + r * hd, correction, hd);
              row_max[r] = m_new;
            }
            gemm_f32(Trans::no, Trans::no, rows, hd, cols, 1.0f, scores.data(), kBlockK,
                     v_head + j0 * ldk, ldk, 1.0f, acc.data(), hd);
          }
          for (int64_t r = 0; r < rows; ++r) {
            float* o = out + ((b * s.seq_q + i0 + r) * H + h) * hd;
            const float inv = 1.0f / row_sum[r];
            for (int64_t d = 0; d < hd; ++d) o[d] = acc[r * hd + d] * inv;
            lse[(b * H + h) * s.seq_q + i0 + r] = row_max[r] + std::log(row_sum[r]);
          }
        }
      }
    }
  }
}

void attention_backward_blockwise(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, const AttentionShape& s) {
  attention_check_shape(s);
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd, offset = s.seq_kv - s.seq_q;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const VecKernels& vk = vec();
  // One task per (batch, kv head): it owns dk/dv of that head and dq of its G query heads, so no
  // two threads write the same element.
#pragma omp parallel
  {
    std::vector<float> p(kBlockQ * kBlockK), dp(kBlockQ * kBlockK), dk_acc(kBlockK * hd),
        dv_acc(kBlockK * hd), delta(G * s.seq_q);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t kvh = 0; kvh < KV; ++kvh) {
        // delta_i = dout_i . out_i, the softmax backward's row term.
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = kvh * G + g;
          for (int64_t i = 0; i < s.seq_q; ++i) {
            const int64_t row = ((b * s.seq_q + i) * H + h) * hd;
            delta[g * s.seq_q + i] = vk.dot(dout + row, out + row, hd);
            std::memset(dq + row, 0, hd * sizeof(float));
          }
        }
        const float* k_head = k + (b * s.seq_kv * KV + kvh) * hd;
        const float* v_head = v + (b * s.seq_kv * KV + kvh) * hd;
        for (int64_t j0 = 0; j0 < s.seq_kv; j0 += kBlockK) {
          const int64_t cols = std::min(kBlockK, s.seq_kv - j0);
          std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
          std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
          // Queries before absolute position j0 see none of this block.
          const int64_t first_query = std::max<int64_t>(0, j0 - offset);
          for (int64_t g = 0; g < G; ++g) {
            const int64_t h = kvh * G + g;
            for (int64_t i0 = first_query / kBlockQ * kBlockQ; i0 < s.seq_q; i0 += kBlockQ) {
              const int64_t rows = std::min(kBlockQ, s.seq_q - i0);
              const float* q_blk = q + ((b * s.seq_q + i0) * H + h) * hd;
              const float* do_blk = dout + ((b * s.seq_q + i0) * H + h) * hd;
              float* dq_blk = dq + ((b * s.seq_q + i0) * H + h) * hd;
              gemm_f32(Trans::no, Trans::yes, rows, cols, hd, scale, q_blk, ldq, k_head + j0 * ldk,
                       ldk, 0.0f, p.data(), kBlockK);
              gemm_f32(Trans::no, Trans::yes, rows, cols, hd, 1.0f, do_blk, ldq, v_head + j0 * ldk,
                       ldk, 0.0f, dp.data(), kBlockK);
              for (int64_t r = 0; r < rows; ++r) {
                float* pr = p.data() + r * kBlockK;
                float* dsr = dp.data() + r * kBlockK;
                const int64_t visible = visible_in_block(offset + i0 + r, j0, cols);
                const float row_lse = lse[(b * H + h) * s.seq_q + i0 + r];
                const float row_delta = delta[g * s.seq_q + i0 + r];
                vk.exp_shift_sum(pr, pr, visible, row_lse);
                std::fill(pr + visible, pr + cols, 0.0f);
                // dS = P * (dP - delta), pre-multiplied by the score scale for dq and dk.
                for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - row_delta) * scale;
              }
              gemm_f32(Trans::yes, Trans::no, cols, hd, rows, 1.0f, p.data(), kBlockK, do_blk, ldq,
                       1.0f, dv_acc.data(), hd);
              gemm_f32(Trans::no, Trans::no, rows, hd, cols, 1.0f, dp.data(), kBlockK,
                       k_head + j0 * ldk, ldk, 1.0f, dq_blk, ldq);
              gemm_f32(Trans::yes, Trans::no, cols, hd, rows, 1.0f, dp.data(), kBlockK, q_blk, ldq,
                       1.0f, dk_acc.data(), hd);
            }
          }
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t row = ((b * s.seq_kv + j0 + c) * KV + kvh) * hd;
            std::memcpy(dk + row, dk_acc.data() + c * hd, hd * sizeof(float));
            std::memcpy(dv + row, dv_acc.data() + c * hd, hd * sizeof(float));
          }
        }
      }
    }
  }
}

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
        double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t j = 0; j < visible; ++j) {
          const float* kj = k + ((b * s.seq_kv + j) * KV + h / G) * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          prob[j] = dot * scale;
          m = std::max(m, prob[j]);
        }
        for (int64_t j = 0; j < visible; ++j) sum += (prob[j] = std::exp(prob[j] - m));
        float* o = out + ((b * s.seq_q + i) * H + h) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < visible; ++j) {
            acc += prob[j] * v[((b * s.seq_kv + j) * KV + h / G) * hd + d];
          }
          o[d] = static_cast<float>(acc / sum);
        }
        lse[(b * H + h) * s.seq_q + i] = static_cast<float>(m + std::log(sum));
      }
    }
  }
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
        for (int64_t j = 0; j <= offset + i; ++j) {
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
