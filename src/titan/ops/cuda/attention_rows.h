// A simple causal GQA attention (ops/attention.h's layouts and contract), written for clarity
// before speed: one team per query row for the forward and dq, one per key row for dk and dv;
// each recomputes the scores it needs (three passes over the keys in the forward). Every
// accumulation is owned by one team member, so results are deterministic without atomics. The
// CUDA kernels (attention.cu) and the host test run this same code. Packed rows
// (AttentionShape::segment_start) are not supported: the kernel's entry says so.
#pragma once

#include <cmath>

#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// The sizes of one call, from AttentionShape (checked by the caller).
struct AttentionDims {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  float scale;  // 1 / sqrt(head_dim)
};

TITAN_HD inline const float* q_row(const float* q, const AttentionDims& s, int64_t b, int64_t i,
                                   int64_t h) {
  return q + ((b * s.seq_q + i) * s.heads + h) * s.head_dim;
}
TITAN_HD inline const float* kv_row(const float* kv, const AttentionDims& s, int64_t b, int64_t j,
                                    int64_t kvh) {
  return kv + ((b * s.seq_kv + j) * s.kv_heads + kvh) * s.head_dim;
}
TITAN_HD inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// Query row `row` = (b * seq_q + i) * heads + h (a block of the kernel): out (hd) and lse. Keys 0
// .. seq_kv - seq_q + i are visible. `tile` holds team.size() floats (one key's probability per
// member).
template <typename Team>
TITAN_HD void attention_forward_query(const Team& team, float* tile, float* out, float* lse,
                                      const float* q, const float* k, const float* v,
                                      const AttentionDims& s, int64_t row) {
  const int64_t h = row % s.heads, i = row / s.heads % s.seq_q, b = row / s.heads / s.seq_q;
  const int64_t kvh = h / (s.heads / s.kv_heads), visible = s.seq_kv - s.seq_q + i + 1;
  const float* qi = q_row(q, s, b, i, h);
  float m = -INFINITY;
  for (int64_t j = team.rank(); j < visible; j += team.size()) {
    m = fmaxf(m, dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale);
  }
  m = team.max(m);
  float sum = 0.0f;
  for (int64_t j = team.rank(); j < visible; j += team.size()) {
    sum += expf(dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale - m);
  }
  const float row_lse = m + logf(team.sum(sum));
  float* o = out + ((b * s.seq_q + i) * s.heads + h) * s.head_dim;
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) o[d] = 0.0f;
  for (int64_t j0 = 0; j0 < visible; j0 += team.size()) {
    const int64_t j = j0 + team.rank();
    tile[team.rank()] =
        j < visible ? expf(dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale - row_lse) : 0.0f;
    team.sync();
    const int64_t n = visible - j0 < team.size() ? visible - j0 : team.size();
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) {
      float acc = o[d];
      for (int64_t t = 0; t < n; ++t) acc += tile[t] * kv_row(v, s, b, j0 + t, kvh)[d];
      o[d] = acc;
    }
    team.sync();
  }
  if (team.rank() == 0) lse[(b * s.heads + h) * s.seq_q + i] = row_lse;
}

// dq of query row `row` (as the forward's) (overwritten): sum over visible keys of dS * k * scale,
// with P = exp(score - lse) and dS = P (dout . v - dout . out). `tile`: team.size() floats.
template <typename Team>
TITAN_HD void attention_backward_query(const Team& team, float* tile, float* dq, const float* dout,
                                       const float* q, const float* k, const float* v,
                                       const float* out, const float* lse, const AttentionDims& s,
                                       int64_t row) {
  const int64_t h = row % s.heads, i = row / s.heads % s.seq_q, b = row / s.heads / s.seq_q;
  const int64_t kvh = h / (s.heads / s.kv_heads), visible = s.seq_kv - s.seq_q + i + 1;
  const float* qi = q_row(q, s, b, i, h);
  const float* doi = q_row(dout, s, b, i, h);
  const float* oi = q_row(out, s, b, i, h);
  float part = 0.0f;
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) part += doi[d] * oi[d];
  const float delta = team.sum(part);
  const float row_lse = lse[(b * s.heads + h) * s.seq_q + i];
  float* dqi = dq + ((b * s.seq_q + i) * s.heads + h) * s.head_dim;
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) dqi[d] = 0.0f;
  for (int64_t j0 = 0; j0 < visible; j0 += team.size()) {
    const int64_t j = j0 + team.rank();
    float ds = 0.0f;
    if (j < visible) {
      const float p = expf(dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale - row_lse);
      ds = p * (dot(doi, kv_row(v, s, b, j, kvh), s.head_dim) - delta) * s.scale;
    }
    tile[team.rank()] = ds;
    team.sync();
    const int64_t n = visible - j0 < team.size() ? visible - j0 : team.size();
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) {
      float acc = dqi[d];
      for (int64_t t = 0; t < n; ++t) acc += tile[t] * kv_row(k, s, b, j0 + t, kvh)[d];
      dqi[d] = acc;
    }
    team.sync();
  }
}

// dk and dv of key row `row` = (b * seq_kv + j) * kv_heads + kvh (overwritten): over the group's
// query heads and the queries that see j (i >= j - (seq_kv - seq_q)), dv += P dout and dk += dS q.
// `tile`: 2 * team.size() floats (P, then dS, per member's (head, query) pair).
template <typename Team>
TITAN_HD void attention_backward_key(const Team& team, float* tile, float* dk, float* dv,
                                     const float* dout, const float* q, const float* k,
                                     const float* v, const float* out, const float* lse,
                                     const AttentionDims& s, int64_t row) {
  const int64_t kvh = row % s.kv_heads, j = row / s.kv_heads % s.seq_kv,
                b = row / s.kv_heads / s.seq_kv;
  const int64_t group = s.heads / s.kv_heads, offset = s.seq_kv - s.seq_q;
  const int64_t first_i = j - offset > 0 ? j - offset : 0;
  const int64_t per_head = s.seq_q - first_i, pairs = per_head > 0 ? group * per_head : 0;
  const float* kj = kv_row(k, s, b, j, kvh);
  const float* vj = kv_row(v, s, b, j, kvh);
  float* dkj = dk + ((b * s.seq_kv + j) * s.kv_heads + kvh) * s.head_dim;
  float* dvj = dv + ((b * s.seq_kv + j) * s.kv_heads + kvh) * s.head_dim;
  float* tile_p = tile;
  float* tile_ds = tile + team.size();
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) dkj[d] = dvj[d] = 0.0f;
  for (int64_t p0 = 0; p0 < pairs; p0 += team.size()) {
    const int64_t pair = p0 + team.rank();
    float p = 0.0f, ds = 0.0f;
    if (pair < pairs) {
      const int64_t h = kvh * group + pair / per_head, i = first_i + pair % per_head;
      const float* doi = q_row(dout, s, b, i, h);
      p = expf(dot(q_row(q, s, b, i, h), kj, s.head_dim) * s.scale -
               lse[(b * s.heads + h) * s.seq_q + i]);
      ds = p * (dot(doi, vj, s.head_dim) - dot(doi, q_row(out, s, b, i, h), s.head_dim)) * s.scale;
    }
    tile_p[team.rank()] = p;
    tile_ds[team.rank()] = ds;
    team.sync();
    const int64_t n = pairs - p0 < team.size() ? pairs - p0 : team.size();
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) {
      float acc_k = dkj[d], acc_v = dvj[d];
      for (int64_t t = 0; t < n; ++t) {
        const int64_t h = kvh * group + (p0 + t) / per_head, i = first_i + (p0 + t) % per_head;
        acc_v += tile_p[t] * q_row(dout, s, b, i, h)[d];
        acc_k += tile_ds[t] * q_row(q, s, b, i, h)[d];
      }
      dkj[d] = acc_k;
      dvj[d] = acc_v;
    }
    team.sync();
  }
}

}  // namespace titan::cuda_rows
