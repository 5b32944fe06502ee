// How far two forms of causal GQA attention over bf16 q, k, v (mixed-precision training's, ops/
// attention.h's *_blockwise_bf16 rounding points) may lie apart, element by element: the CPU's and
// CUDA's (test_cuda_rows on the host, titan_cuda_kernels_test on a GPU). Each form rounds the
// forward's probabilities P (exp(score - a max), the sum divided out after) to bf16 once for P V,
// and in the backward P for dv and dS for dq and dk, each from fp32 values the two forms compute
// within `tol` relative of each other (sums in other orders, another exp). A rounding to nearest
// errs by at most half a bf16 step, 2^-8 of the value, so two such roundings lie at most 2^-7
// apart -- whatever max each form shifted by (the CPU's running max over 128-key blocks, CUDA's
// over the row). Each output element is then bounded by (2^-7 + tol) times the sum of its
// products' magnitudes, computed here in fp64 from the widened operands:
//   out_i = sum_j P_ij v_j              ->  (2^-7 + tol) sum_j P_ij |v_j|
//   dv_j  = sum_i P_ij dout_i           ->  (2^-7 + tol) sum_i P_ij |dout_i|  (dout rounded alike)
//   dS_ij = P_ij (dP_ij - delta_i) scale, dP = dout . v_j and delta = dout . out_i fp32 dots:
//           E_ij = (2^-7 + tol) |dS_ij| + P_ij scale tol (sum |dout v_j| + sum |dout out_i|)
//   dq_i  = sum_j dS_ij k_j  ->  sum_j (E_ij + tol |dS_ij|) |k_j|, and dk_j likewise over q_i.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/ops/attention.h"

namespace titan::test {

struct AttentionBf16Bounds {
  std::vector<double> out, dq, dk, dv;  // per element, in the outputs' layouts
};

// `out` and `lse`: the forward's bf16 out and lse the backwards were given (the same to both).
inline AttentionBf16Bounds attention_bf16_bounds(const AttentionShape& s, const uint16_t* q,
                                                 const uint16_t* k, const uint16_t* v,
                                                 const float* dout, const uint16_t* out,
                                                 const float* lse, double tol) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads, offset = s.seq_kv - s.seq_q;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const double step = std::ldexp(1.0, -7) + tol;
  const auto w = [](uint16_t b) { return static_cast<double>(bf16_to_f32(b)); };
  const auto r16 = [](float x) { return static_cast<double>(bf16_to_f32(f32_to_bf16(x))); };
  const auto nq = static_cast<size_t>(s.batch * s.seq_q * s.n_heads * hd);
  const auto nkv = static_cast<size_t>(s.batch * s.seq_kv * s.n_kv_heads * hd);
  AttentionBf16Bounds bounds{std::vector<double>(nq), std::vector<double>(nq),
                             std::vector<double>(nkv), std::vector<double>(nkv)};
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t qa = ((b * s.seq_q + i) * s.n_heads + h) * hd;
        const double row_lse = lse[(b * s.n_heads + h) * s.seq_q + i];
        double delta = 0.0, out_mag = 0.0;
        for (int64_t d = 0; d < hd; ++d) {
          delta += dout[qa + d] * w(out[qa + d]);
          out_mag += std::fabs(dout[qa + d] * w(out[qa + d]));
        }
        for (int64_t j = 0; j <= offset + i; ++j) {
          const int64_t ka = ((b * s.seq_kv + j) * s.n_kv_heads + kvh) * hd;
          double score = 0.0, dp = 0.0, v_mag = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            score += w(q[qa + d]) * w(k[ka + d]);
            dp += r16(dout[qa + d]) * w(v[ka + d]);
            v_mag += std::fabs(r16(dout[qa + d]) * w(v[ka + d]));
          }
          const double p = std::exp(score * scale - row_lse);
          const double ds = p * (dp - delta) * scale;
          const double ds_apart =
              step * std::fabs(ds) + p * scale * tol * (v_mag + out_mag) + tol * std::fabs(ds);
          for (int64_t d = 0; d < hd; ++d) {
            bounds.out[qa + d] += step * p * std::fabs(w(v[ka + d]));
            bounds.dv[ka + d] += step * p * std::fabs(r16(dout[qa + d]));
            bounds.dq[qa + d] += ds_apart * std::fabs(w(k[ka + d]));
            bounds.dk[ka + d] += ds_apart * std::fabs(w(q[qa + d]));
          }
        }
      }
    }
  }
  return bounds;
}

}  // namespace titan::test
