// A simple causal GQA attention (ops/attention.h's layouts and contract), written for clarity
// before speed: one team per query row for the forward and dq, one per key row for dk and dv;
// each recomputes the scores it needs (three passes over the keys in the forward). Every
// accumulation is owned by one team member, so results are deterministic without atomics. The
// CUDA kernels (attention.cu) and the host test run this same code. Packed rows
// (AttentionShape::segment_start) are not supported: the kernel's entry says so.
//
// Each body takes q, k, v (and out) as T: float, or uint16_t -- bf16 bits, mixed-precision
// training's forms (ops/attention.h's *_blockwise_bf16) at the CPU's rounding points: the products
// of bf16 operands accumulated in fp32 (what a bf16 GEMM computes), the softmax in fp32; the
// forward's probabilities exp(score - max) rounded to bf16 for P V and the sum divided out after
// (the max over every visible key: the CPU's running max over its one key block for up to 128
// keys); the backward's dout rounded to bf16 for its products (not for delta = dout . out), P
// rounded for dv and dS for dq and dk. With T = float every value is used as it is.
#pragma once

#include <cmath>
#include <type_traits>

#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// The sizes of one call, from AttentionShape (checked by the caller).
struct AttentionDims {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  float scale;  // 1 / sqrt(head_dim)
};

template <typename T>
inline constexpr bool kBf16Operands = std::is_same_v<T, uint16_t>;

TITAN_HD inline float load(const float* p) {
  return *p;
}
TITAN_HD inline float load(const uint16_t* p) {
  return from_bf16(*p);
}
// `x` as the bf16 form's products take it (rounded to bf16), or as it is under fp32.
template <typename T>
TITAN_HD inline float operand(float x) {
  if constexpr (kBf16Operands<T>) {
    return from_bf16(to_bf16(x));
  } else {
    return x;
  }
}

template <typename T>
TITAN_HD inline const T* q_row(const T* q, const AttentionDims& s, int64_t b, int64_t i,
                               int64_t h) {
  return q + ((b * s.seq_q + i) * s.heads + h) * s.head_dim;
}
template <typename T>
TITAN_HD inline const T* kv_row(const T* kv, const AttentionDims& s, int64_t b, int64_t j,
                                int64_t kvh) {
  return kv + ((b * s.seq_kv + j) * s.kv_heads + kvh) * s.head_dim;
}
template <typename A, typename B>
TITAN_HD inline float dot(const A* a, const B* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += load(a + d) * load(b + d);
  return acc;
}
// dout . b with dout as the form's products take it (operand<T>).
template <typename T>
TITAN_HD inline float dot_dout(const float* dout, const T* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += operand<T>(dout[d]) * load(b + d);
  return acc;
}

// Query row `row` = (b * seq_q + i) * heads + h (a block of the kernel): out (hd) and lse. Keys 0
// .. seq_kv - seq_q + i are visible. `tile` holds team.size() floats (one key's probability per
// member).
template <typename T, typename Team>
TITAN_HD void attention_forward_query(const Team& team, float* tile, float* out, float* lse,
                                      const T* q, const T* k, const T* v, const AttentionDims& s,
                                      int64_t row) {
  const int64_t h = row % s.heads, i = row / s.heads % s.seq_q, b = row / s.heads / s.seq_q;
  const int64_t kvh = h / (s.heads / s.kv_heads), visible = s.seq_kv - s.seq_q + i + 1;
  const T* qi = q_row(q, s, b, i, h);
  float m = -INFINITY;
  for (int64_t j = team.rank(); j < visible; j += team.size()) {
    m = fmaxf(m, dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale);
  }
  m = team.max(m);
  float sum = 0.0f;
  for (int64_t j = team.rank(); j < visible; j += team.size()) {
    sum += expf(dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale - m);
  }
  const float total = team.sum(sum);
  const float row_lse = m + logf(total);
  // fp32: P normalised as it is made; bf16: exp(score - max) rounded, the sum divided out after.
  const float shift = kBf16Operands<T> ? m : row_lse;
  float* o = out + ((b * s.seq_q + i) * s.heads + h) * s.head_dim;
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) o[d] = 0.0f;
  for (int64_t j0 = 0; j0 < visible; j0 += team.size()) {
    const int64_t j = j0 + team.rank();
    tile[team.rank()] =
        j < visible
            ? operand<T>(expf(dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale - shift))
            : 0.0f;
    team.sync();
    const int64_t n = visible - j0 < team.size() ? visible - j0 : team.size();
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) {
      float acc = o[d];
      for (int64_t t = 0; t < n; ++t) acc += tile[t] * load(kv_row(v, s, b, j0 + t, kvh) + d);
      o[d] = acc;
    }
    team.sync();
  }
  if constexpr (kBf16Operands<T>) {
    const float inverse = 1.0f / total;
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) o[d] *= inverse;
  }
  if (team.rank() == 0) lse[(b * s.heads + h) * s.seq_q + i] = row_lse;
}

// dq of query row `row` (as the forward's) (overwritten): sum over visible keys of dS * k * scale,
// with P = exp(score - lse) and dS = P (dout . v - dout . out). `tile`: team.size() floats.
template <typename T, typename Team>
TITAN_HD void attention_backward_query(const Team& team, float* tile, float* dq, const float* dout,
                                       const T* q, const T* k, const T* v, const T* out,
                                       const float* lse, const AttentionDims& s, int64_t row) {
  const int64_t h = row % s.heads, i = row / s.heads % s.seq_q, b = row / s.heads / s.seq_q;
  const int64_t kvh = h / (s.heads / s.kv_heads), visible = s.seq_kv - s.seq_q + i + 1;
  const T* qi = q_row(q, s, b, i, h);
  const float* doi = q_row(dout, s, b, i, h);
  const T* oi = q_row(out, s, b, i, h);
  float part = 0.0f;
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) part += doi[d] * load(oi + d);
  const float delta = team.sum(part);
  const float row_lse = lse[(b * s.heads + h) * s.seq_q + i];
  float* dqi = dq + ((b * s.seq_q + i) * s.heads + h) * s.head_dim;
  for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) dqi[d] = 0.0f;
  for (int64_t j0 = 0; j0 < visible; j0 += team.size()) {
    const int64_t j = j0 + team.rank();
    float ds = 0.0f;
    if (j < visible) {
      const float p = expf(dot(qi, kv_row(k, s, b, j, kvh), s.head_dim) * s.scale - row_lse);
      ds = operand<T>(p * (dot_dout(doi, kv_row(v, s, b, j, kvh), s.head_dim) - delta) * s.scale);
    }
    tile[team.rank()] = ds;
    team.sync();
    const int64_t n = visible - j0 < team.size() ? visible - j0 : team.size();
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) {
      float acc = dqi[d];
      for (int64_t t = 0; t < n; ++t) acc += tile[t] * load(kv_row(k, s, b, j0 + t, kvh) + d);
      dqi[d] = acc;
    }
    team.sync();
  }
}

// dk and dv of key row `row` = (b * seq_kv + j) * kv_heads + kvh (overwritten): over the group's
// query heads and the queries that see j (i >= j - (seq_kv - seq_q)), dv += P dout and dk += dS q.
// `tile`: 2 * team.size() floats (P, then dS, per member's (head, query) pair).
template <typename T, typename Team>
TITAN_HD void attention_backward_key(const Team& team, float* tile, float* dk, float* dv,
                                     const float* dout, const T* q, const T* k, const T* v,
                                     const T* out, const float* lse, const AttentionDims& s,
                                     int64_t row) {
  const int64_t kvh = row % s.kv_heads, j = row / s.kv_heads % s.seq_kv,
                b = row / s.kv_heads / s.seq_kv;
  const int64_t group = s.heads / s.kv_heads, offset = s.seq_kv - s.seq_q;
  const int64_t first_i = j - offset > 0 ? j - offset : 0;
  const int64_t per_head = s.seq_q - first_i, pairs = per_head > 0 ? group * per_head : 0;
  const T* kj = kv_row(k, s, b, j, kvh);
  const T* vj = kv_row(v, s, b, j, kvh);
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
      // delta = dout . out, dout as it is (the CPU's form computes it apart from the products).
      ds = p * (dot_dout(doi, vj, s.head_dim) - dot(doi, q_row(out, s, b, i, h), s.head_dim)) *
           s.scale;
    }
    tile_p[team.rank()] = operand<T>(p);
    tile_ds[team.rank()] = operand<T>(ds);
    team.sync();
    const int64_t n = pairs - p0 < team.size() ? pairs - p0 : team.size();
    for (int64_t d = team.rank(); d < s.head_dim; d += team.size()) {
      float acc_k = dkj[d], acc_v = dvj[d];
      for (int64_t t = 0; t < n; ++t) {
        const int64_t h = kvh * group + (p0 + t) / per_head, i = first_i + (p0 + t) % per_head;
        acc_v += tile_p[t] * operand<T>(q_row(dout, s, b, i, h)[d]);
        acc_k += tile_ds[t] * load(q_row(q, s, b, i, h) + d);
      }
      dkj[d] = acc_k;
      dvj[d] = acc_v;
    }
    team.sync();
  }
}

}  // namespace titan::cuda_rows
