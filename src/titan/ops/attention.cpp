#include "titan/ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/dtype.h"
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

// The first key of a block (keys key0...) that query `i` of row `b` may see: 0 without segments,
// else its segment's start within the block (clamped to [0, block_cols]).
int64_t first_in_block(const AttentionShape& s, int64_t b, int64_t i, int64_t key0,
                       int64_t block_cols) {
  if (s.segment_start == nullptr) return 0;
  return std::clamp<int64_t>(s.segment_start[b * s.seq_q + i] - key0, 0, block_cols);
}

// Queries of the G heads that share a kv head are stacked into one block of G * rows rows, so
// each GEMM against a key block is G times taller (better GEMM efficiency, K and V read once).
// Stacked row g * rows + r is query i0 + r of head kvh * G + g.
template <typename T>
void gather_query_heads(T* stacked, const T* src, int64_t row0, int64_t rows, int64_t kv_head,
                        int64_t group, int64_t n_heads, int64_t head_dim) {
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(stacked + (g * rows + r) * head_dim,
                  src + ((row0 + r) * n_heads + kv_head * group + g) * head_dim,
                  head_dim * sizeof(T));
    }
  }
}

void scatter_query_heads(float* dst, const float* stacked, int64_t row0, int64_t rows,
                         int64_t kv_head, int64_t group, int64_t n_heads, int64_t head_dim) {
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + ((row0 + r) * n_heads + kv_head * group + g) * head_dim,
                  stacked + (g * rows + r) * head_dim, head_dim * sizeof(float));
    }
  }
}

// fn(j, len) for each piece [j, j + len) of keys [j0, j1) that lies within one kBlockK block.
template <typename Fn>
void for_each_block_segment(int64_t j0, int64_t j1, const Fn& fn) {
  for (int64_t j = j0; j < j1;) {
    const int64_t end = std::min(j1, (j / kBlockK + 1) * kBlockK);
    fn(j, end - j);
    j = end;
  }
}

// One query per sequence (a decode step), split over the keys ("flash decoding"): each thread
// takes a contiguous range of cache rows, all heads, and streams it row after row -- the access
// the hardware prefetcher follows best. Splitting by kv head instead had each thread read half of
// every 4 KiB row (at 8 x 128), and the cache streamed at 13-17 GB/s, half the weights' rate.
// Eight ranges handed out dynamically (as the GEMVs' blocks are, so that a descheduled thread
// holds up one range, not half the cache) measured no faster than these static halves on the
// loaded 2-vCPU VM, and slower as long as the loop kept its own barrier.
// A thread leaves, per head, its range's max score, sum of exponentials and unnormalised output;
// the calling thread merges them after the join (no barrier inside the region, which would be
// one more team-wide wait per layer, but for kRoundP's below). A thread's range is two vector
// calls: every head's scores over all its rows (gqa_scores: each kv head's slice of a row read once
// for the query heads sharing it), the softmax per head, then the weighted sum of its value rows
// (gqa_values, the same way). Two calls per key row and kv head (a G-row GEMV, then G axpys) cost
// more in calls than the rows' bytes (docs/PERFORMANCE.md, bf16 inference).
//
// bf16 keys and values (KV = uint16_t) are widened in registers, with their fp32 side in
// gemv_bf16_split_x's layout: each query head is split once, and each head's output accumulates
// split and is put back in order by the merge.
//
// kRoundP (a bf16 model over a bf16 cache): the probabilities are rounded to bf16 before they
// weight the values, as the blockwise bf16 forward rounds them for its P V GEMMs -- and with the
// same reference: each key's exp(score - m) takes m the running max of the kBlockK-key blocks up
// to its own, as the block loop has it when it reaches that block. So a decode step attends as
// the prompt's rows did. The block maxima need every thread's scores: one barrier.
template <typename KV, bool kRoundP = false>
void attention_forward_one_query(float* out, float* lse, const float* q, const KV* k, const KV* v,
                                 const AttentionShape& s) {
  constexpr bool kBf16 = std::is_same_v<KV, uint16_t>;
  static_assert(kBf16 || !kRoundP, "rounded probabilities belong to the bf16 cache's forward");
  const int64_t H = s.n_heads, KV_heads = s.n_kv_heads, hd = s.head_dim;
  const int64_t ldk = KV_heads * hd, n_keys = s.seq_kv;
  const GqaHeads heads{KV_heads, H / KV_heads, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const VecKernels& vk = backend().vec();
  const int64_t max_threads = std::min<int64_t>(omp_get_max_threads(), n_keys);
  // Per thread t and sequence b: (H) max, (H) sum, (H, hd) output -- stride per (t, b).
  const int64_t part = H * (hd + 2);
  std::vector<float> parts(static_cast<size_t>(max_threads * s.batch * part));
  std::vector<float> q_split(kBf16 ? static_cast<size_t>(s.batch * H * hd) : 0);
  if constexpr (kBf16) {
    for (int64_t r = 0; r < s.batch * H; ++r) {
      gemv_bf16_split_x(q_split.data() + r * hd, q + r * hd, hd);
    }
  }
  // kRoundP: per thread, sequence, head and key block, the max of the thread's scores in it.
  const int64_t n_blocks = (n_keys + kBlockK - 1) / kBlockK;
  std::vector<float> block_max(
      kRoundP ? static_cast<size_t>(max_threads * s.batch * H * n_blocks) : 0, kNegInf);
  int64_t used_threads = 1;  // the team OpenMP gave, at most max_threads
#pragma omp parallel num_threads(max_threads)
  {
    const int64_t n_threads = omp_get_num_threads(), t = omp_get_thread_num();
    if (t == 0) used_threads = n_threads;
    const int64_t j0 = n_keys * t / n_threads, j1 = n_keys * (t + 1) / n_threads, n = j1 - j0;
    std::vector<float> p(static_cast<size_t>(s.batch * H * n));  // (B, H, n) scores, then weights
    std::vector<uint16_t> p_bits(kRoundP ? static_cast<size_t>(n) : 0);
    std::vector<float> running_max(kRoundP ? static_cast<size_t>(n_blocks) : 0);
    for (int64_t b = 0; b < s.batch; ++b) {
      float* pb = p.data() + b * H * n;
      const KV* kb = k + (b * n_keys + j0) * ldk;
      if constexpr (kBf16) {
        vk.gqa_scores_bf16(pb, n, q_split.data() + b * H * hd, kb, ldk, n, heads);
      } else {
        vk.gqa_scores_f32(pb, n, q + b * H * hd, kb, ldk, n, heads);
      }
      for (int64_t h = 0; h < H; ++h) {
        float* row = pb + h * n;
        vk.scale(row, scale, n);
        if constexpr (kRoundP) {
          float* own = block_max.data() + ((t * s.batch + b) * H + h) * n_blocks;
          for_each_block_segment(j0, j1, [&](int64_t j, int64_t len) {
            own[j / kBlockK] = vk.max(row + (j - j0), len);
          });
        }
      }
    }
    if constexpr (kRoundP) {
#pragma omp barrier
    }
    for (int64_t b = 0; b < s.batch; ++b) {
      float* pb = p.data() + b * H * n;
      const KV* vb = v + (b * n_keys + j0) * ldk;
      float* row_max = parts.data() + (t * s.batch + b) * part;
      float* row_sum = row_max + H;
      float* acc = row_sum + H;  // (H, hd)
      for (int64_t h = 0; h < H; ++h) {
        float* row = pb + h * n;
        if constexpr (kRoundP) {
          // Each block's running max over every thread's scores up to it; the thread's range is
          // then weighted relative to the running max of its last block.
          float running = kNegInf;
          for (int64_t blk = 0; blk < n_blocks; ++blk) {
            for (int64_t u = 0; u < n_threads; ++u) {
              running = std::max(running, block_max[((u * s.batch + b) * H + h) * n_blocks + blk]);
            }
            running_max[static_cast<size_t>(blk)] = running;
          }
          row_max[h] = running_max[static_cast<size_t>((j1 - 1) / kBlockK)];
          row_sum[h] = 0.0f;
          for_each_block_segment(j0, j1, [&](int64_t j, int64_t len) {
            const float m = running_max[static_cast<size_t>(j / kBlockK)];
            float* seg = row + (j - j0);
            const float segment_sum = vk.exp_shift_sum(seg, seg, len, m);
            vk.round_to_bf16(p_bits.data(), seg, 1.0f, len);
            vk.widen_bf16(seg, p_bits.data(), len);
            const float to_last = std::exp(m - row_max[h]);
            if (to_last != 1.0f) vk.scale(seg, to_last, len);
            row_sum[h] += to_last * segment_sum;
          });
        } else {
          row_max[h] = vk.max(row, n);
          row_sum[h] = vk.exp_shift_sum(row, row, n, row_max[h]);
        }
      }
      std::fill(acc, acc + H * hd, 0.0f);
      if constexpr (kBf16) {
        vk.gqa_values_bf16(acc, pb, n, vb, ldk, n, heads);
      } else {
        vk.gqa_values_f32(acc, pb, n, vb, ldk, n, heads);
      }
    }
  }
  // Merge the threads' ranges: out = sum_t e^(m_t - m) acc_t / sum_t e^(m_t - m) l_t.
  std::vector<float> merged(static_cast<size_t>(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      float m = kNegInf;
      for (int64_t t = 0; t < used_threads; ++t) {
        m = std::max(m, parts[(t * s.batch + b) * part + h]);
      }
      float* o = out + (b * H + h) * hd;
      float* sum_into = kBf16 ? merged.data() : o;
      std::fill(sum_into, sum_into + hd, 0.0f);
      float sum = 0.0f;
      for (int64_t t = 0; t < used_threads; ++t) {
        const float* base = parts.data() + (t * s.batch + b) * part;
        const float w = std::exp(base[h] - m);
        sum += w * base[H + h];
        vk.axpy(sum_into, w, base + 2 * H + h * hd, hd);
      }
      vk.scale(sum_into, 1.0f / sum, hd);
      if constexpr (kBf16) gemv_bf16_unsplit_x(o, merged.data(), hd);
      lse[b * H + h] = m + std::log(sum);
    }
  }
}

// The block GEMMs: fp32 operands through the calling thread's block GEMM, or bf16 operands
// (mixed-precision training's q, k, v as kept, and the probabilities, output gradient and score
// gradients rounded) through the bf16 GEMM, fp32 accumulation either way.
void block_gemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  backend().gemm_f32_block(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void block_gemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                float* c, int64_t ldc) {
  backend().gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Rows [j0, j0 + cols) of one kv head's keys or values (rows ld apart) as the block GEMMs read
// them: the rows themselves (fp32, or bf16 for bf16 GEMMs), or bf16 rows widened into `staging`
// (cols, hd), hd apart, for fp32 GEMMs. `ld_out` is their stride.
template <typename Operand, typename KV>
const Operand* key_block(const KV* head, int64_t ld, int64_t j0, int64_t cols, int64_t hd,
                         float* staging, int64_t& ld_out) {
  if constexpr (std::is_same_v<Operand, KV>) {
    ld_out = ld;
    return head + j0 * ld;
  } else {
    const VecKernels& vk = backend().vec();
    for (int64_t r = 0; r < cols; ++r) vk.widen_bf16(staging + r * hd, head + (j0 + r) * ld, hd);
    ld_out = hd;
    return staging;
  }
}

// The blockwise forward. Q is the type of q and of the block GEMMs' operands: fp32 over fp32 or
// bf16 (raw bits, widened per key block) keys and values, or bf16 throughout, where each block's
// probabilities exp(score - running max) are computed in fp32 and rounded to bf16 for P V.
template <typename Q, typename KV>
void attention_forward_blocks(float* out, float* lse, const Q* q, const KV* k, const KV* v,
                              const AttentionShape& s) {
  attention_check_shape(s);
  constexpr bool kBf16Gemm = std::is_same_v<Q, uint16_t>;
  static_assert(!kBf16Gemm || std::is_same_v<KV, uint16_t>, "bf16 GEMMs need bf16 keys");
  if (s.seq_q == 1 && s.segment_start == nullptr) {
    if constexpr (kBf16Gemm) {
      // A bf16 model's decode step over its bf16 cache: q widened exactly, P rounded.
      std::vector<float> q_f32(static_cast<size_t>(s.batch * s.n_heads * s.head_dim));
      backend().vec().widen_bf16(q_f32.data(), q, static_cast<int64_t>(q_f32.size()));
      attention_forward_one_query<uint16_t, true>(out, lse, q_f32.data(), k, v, s);
    } else {
      attention_forward_one_query(out, lse, q, k, v, s);
    }
    return;
  }
  constexpr bool kWidenKv = !std::is_same_v<Q, KV>;
  const int64_t H = s.n_heads, KV_heads = s.n_kv_heads, hd = s.head_dim, G = H / KV_heads;
  const int64_t ldk = KV_heads * hd, offset = s.seq_kv - s.seq_q;
  const int64_t n_qblocks = (s.seq_q + kBlockQ - 1) / kBlockQ;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const VecKernels& vk = backend().vec();
#pragma omp parallel
  {
    std::vector<Q> q_blk(G * kBlockQ * hd);
    std::vector<float> scores(G * kBlockQ * kBlockK), acc(G * kBlockQ * hd), row_max(G * kBlockQ),
        row_sum(G * kBlockQ);
    std::vector<float> k_staging(kWidenKv ? kBlockK * hd : 0),
        v_staging(kWidenKv ? kBlockK * hd : 0);
    std::vector<uint16_t> p_bf16(kBf16Gemm ? G * kBlockQ * kBlockK : 0);
    const Q* p_op = nullptr;  // P as P V reads it
    if constexpr (kBf16Gemm) {
      p_op = p_bf16.data();
    } else {
      p_op = scores.data();
    }
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t kvh = 0; kvh < KV_heads; ++kvh) {
        for (int64_t qb = 0; qb < n_qblocks; ++qb) {
          const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, s.seq_q - i0);
          const int64_t m = G * rows;  // stacked rows
          gather_query_heads(q_blk.data(), q + b * s.seq_q * H * hd, i0, rows, kvh, G, H, hd);
          const KV* k_head = k + (b * s.seq_kv * KV_heads + kvh) * hd;
          const KV* v_head = v + (b * s.seq_kv * KV_heads + kvh) * hd;
          std::fill(acc.begin(), acc.begin() + m * hd, 0.0f);
          std::fill(row_max.begin(), row_max.begin() + m, kNegInf);
          std::fill(row_sum.begin(), row_sum.begin() + m, 0.0f);
          const int64_t key_end = offset + i0 + rows;  // keys past the last query are masked
          // Packed rows: key blocks wholly before the block's first segment are skipped.
          const int64_t key_begin = s.segment_start == nullptr
                                        ? 0
                                        : s.segment_start[b * s.seq_q + i0] / kBlockK * kBlockK;
          for (int64_t j0 = key_begin; j0 < key_end; j0 += kBlockK) {
            const int64_t cols = std::min(kBlockK, key_end - j0);
            int64_t ld_k = 0, ld_v = 0;
            const Q* k_blk = key_block<Q>(k_head, ldk, j0, cols, hd, k_staging.data(), ld_k);
            const Q* v_blk = key_block<Q>(v_head, ldk, j0, cols, hd, v_staging.data(), ld_v);
            block_gemm(Trans::no, Trans::yes, m, cols, hd, scale, q_blk.data(), hd, k_blk, ld_k,
                       0.0f, scores.data(), kBlockK);
            for (int64_t sr = 0; sr < m; ++sr) {
              float* row = scores.data() + sr * kBlockK;
              const int64_t visible = visible_in_block(offset + i0 + sr % rows, j0, cols);
              const int64_t first = first_in_block(s, b, i0 + sr % rows, j0, visible);
              std::fill(row, row + first, 0.0f);
              std::fill(row + visible, row + cols, 0.0f);
              if (visible > first) {
                const int64_t n = visible - first;
                const float m_new = std::max(row_max[sr], vk.max(row + first, n));
                const float correction = std::exp(row_max[sr] - m_new);  // 0 on the first block
                row_sum[sr] =
                    row_sum[sr] * correction + vk.exp_shift_sum(row + first, row + first, n, m_new);
                if (correction != 1.0f) vk.scale(acc.data() + sr * hd, correction, hd);
                row_max[sr] = m_new;
              }
              if constexpr (kBf16Gemm) {
                vk.round_to_bf16(p_bf16.data() + sr * kBlockK, row, 1.0f, cols);
              }
            }
            block_gemm(Trans::no, Trans::no, m, hd, cols, 1.0f, p_op, kBlockK, v_blk, ld_v, 1.0f,
                       acc.data(), hd);
          }
          for (int64_t sr = 0; sr < m; ++sr) {
            vk.scale(acc.data() + sr * hd, 1.0f / row_sum[sr], hd);
            const int64_t h = kvh * G + sr / rows, i = i0 + sr % rows;
            lse[(b * H + h) * s.seq_q + i] = row_max[sr] + std::log(row_sum[sr]);
          }
          scatter_query_heads(out + b * s.seq_q * H * hd, acc.data(), i0, rows, kvh, G, H, hd);
        }
      }
    }
  }
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
  if (s.segment_start == nullptr) return;
  TITAN_CHECK(s.seq_q == s.seq_kv, "attention: segment starts (packed rows) with ", s.seq_q,
              " queries over ", s.seq_kv, " keys: they need as many queries as keys");
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* row = s.segment_start + b * s.seq_q;
    for (int64_t i = 0; i < s.seq_q; ++i) {
      TITAN_CHECK(row[i] >= 0 && row[i] <= i && (i == 0 || row[i] >= row[i - 1]), "attention: row ",
                  b, ", query ", i, " has segment start ", row[i],
                  ": starts must be non-decreasing along a row, each at most its query's position");
    }
  }
}

void attention_forward_blockwise(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& s) {
  attention_forward_blocks(out, lse, q, k, v, s);
}

void attention_forward_blockwise_bf16_kv(float* out, float* lse, const float* q, const uint16_t* k,
                                         const uint16_t* v, const AttentionShape& s) {
  attention_forward_blocks(out, lse, q, k, v, s);
}

void attention_forward_blockwise_bf16(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                                      const uint16_t* v, const AttentionShape& s) {
  attention_forward_blocks(out, lse, q, k, v, s);
}

namespace {

// FlashAttention-2's backward over fp32 or bf16 (raw bits, T = uint16_t) q, k, v and out. Under
// bf16 the five GEMMs take bf16 operands: dout is rounded once, and each block's probabilities P
// and score gradients dS = P (dP - delta) are computed in fp32, then rounded for the GEMMs they
// feed (dv += P^T dout; dq += dS k; dk += dS^T q). delta, the softmax's row term, stays fp32 from
// the unrounded dout.
template <typename T>
void attention_backward_blocks(float* dq, float* dk, float* dv, const float* dout, const T* q,
                               const T* k, const T* v, const T* out, const float* lse,
                               const AttentionShape& s) {
  attention_check_shape(s);
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  const int64_t H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim, G = H / KV;
  const int64_t ldk = KV * hd, offset = s.seq_kv - s.seq_q;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const VecKernels& vk = backend().vec();
  // One task per (batch, kv head): it owns dk/dv of that head and dq of its G query heads, so no
  // two threads write the same element. The task's queries, output gradients and dq are kept
  // stacked per query block (block qb at row qb * G * kBlockQ; see gather_query_heads).
#pragma omp parallel
  {
    std::vector<float> p(G * kBlockQ * kBlockK), dp(G * kBlockQ * kBlockK), dk_acc(kBlockK * hd),
        dv_acc(kBlockK * hd), do_st(G * s.seq_q * hd), dq_st(G * s.seq_q * hd), lse_st(G * s.seq_q),
        delta_st(G * s.seq_q), out_row(kBf16 ? hd : 0);
    std::vector<T> q_st(G * s.seq_q * hd);
    // bf16: dout, P and dS rounded (fp32: unused; the GEMMs read do_st, p and dp).
    std::vector<uint16_t> do_bf16(kBf16 ? G * s.seq_q * hd : 0),
        p_bf16(kBf16 ? G * kBlockQ * kBlockK : 0), ds_bf16(kBf16 ? G * kBlockQ * kBlockK : 0);
    const T* do_op = nullptr;
    const T* p_op = nullptr;
    const T* ds_op = nullptr;
    if constexpr (kBf16) {
      do_op = do_bf16.data(), p_op = p_bf16.data(), ds_op = ds_bf16.data();
    } else {
      do_op = do_st.data(), p_op = p.data(), ds_op = dp.data();
    }
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t kvh = 0; kvh < KV; ++kvh) {
        const int64_t base = b * s.seq_q * H * hd;
        for (int64_t i0 = 0; i0 < s.seq_q; i0 += kBlockQ) {
          const int64_t rows = std::min(kBlockQ, s.seq_q - i0), at = G * i0;
          gather_query_heads(q_st.data() + at * hd, q + base, i0, rows, kvh, G, H, hd);
          gather_query_heads(do_st.data() + at * hd, dout + base, i0, rows, kvh, G, H, hd);
          if constexpr (kBf16) {
            vk.round_to_bf16(do_bf16.data() + at * hd, do_st.data() + at * hd, 1.0f, G * rows * hd);
          }
          for (int64_t sr = 0; sr < G * rows; ++sr) {
            const int64_t h = kvh * G + sr / rows, i = i0 + sr % rows;
            const T* out_at = out + base + (i * H + h) * hd;
            const float* o = nullptr;
            if constexpr (kBf16) {
              vk.widen_bf16(out_row.data(), out_at, hd);
              o = out_row.data();
            } else {
              o = out_at;
            }
            // delta_i = dout_i . out_i, the softmax backward's row term.
            delta_st[at + sr] = vk.dot(do_st.data() + (at + sr) * hd, o, hd);
            lse_st[at + sr] = lse[(b * H + h) * s.seq_q + i];
          }
        }
        std::fill(dq_st.begin(), dq_st.end(), 0.0f);
        const T* k_head = k + (b * s.seq_kv * KV + kvh) * hd;
        const T* v_head = v + (b * s.seq_kv * KV + kvh) * hd;
        for (int64_t j0 = 0; j0 < s.seq_kv; j0 += kBlockK) {
          const int64_t cols = std::min(kBlockK, s.seq_kv - j0);
          std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
          std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
          // Queries before absolute position j0 see none of this block.
          const int64_t first_query = std::max<int64_t>(0, j0 - offset);
          for (int64_t i0 = first_query / kBlockQ * kBlockQ; i0 < s.seq_q; i0 += kBlockQ) {
            // Packed rows: from the query block whose first segment starts past this key block
            // on, no query sees it (starts are non-decreasing).
            if (s.segment_start != nullptr && s.segment_start[b * s.seq_q + i0] >= j0 + cols) break;
            const int64_t rows = std::min(kBlockQ, s.seq_q - i0), m = G * rows, at = G * i0;
            const T* q_blk = q_st.data() + at * hd;
            const T* do_blk = do_op + at * hd;
            block_gemm(Trans::no, Trans::yes, m, cols, hd, scale, q_blk, hd, k_head + j0 * ldk, ldk,
                       0.0f, p.data(), kBlockK);
            block_gemm(Trans::no, Trans::yes, m, cols, hd, 1.0f, do_blk, hd, v_head + j0 * ldk, ldk,
                       0.0f, dp.data(), kBlockK);
            for (int64_t sr = 0; sr < m; ++sr) {
              float* pr = p.data() + sr * kBlockK;
              float* dsr = dp.data() + sr * kBlockK;
              const int64_t visible = visible_in_block(offset + i0 + sr % rows, j0, cols);
              const int64_t first = first_in_block(s, b, i0 + sr % rows, j0, visible);
              const float row_delta = delta_st[at + sr];
              vk.exp_shift_sum(pr + first, pr + first, visible - first, lse_st[at + sr]);
              std::fill(pr, pr + first, 0.0f);
              std::fill(pr + visible, pr + cols, 0.0f);
              // dS = P * (dP - delta), pre-multiplied by the score scale for dq and dk.
              for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - row_delta) * scale;
              if constexpr (kBf16) {
                vk.round_to_bf16(p_bf16.data() + sr * kBlockK, pr, 1.0f, cols);
                vk.round_to_bf16(ds_bf16.data() + sr * kBlockK, dsr, 1.0f, cols);
              }
            }
            block_gemm(Trans::yes, Trans::no, cols, hd, m, 1.0f, p_op, kBlockK, do_blk, hd, 1.0f,
                       dv_acc.data(), hd);
            block_gemm(Trans::no, Trans::no, m, hd, cols, 1.0f, ds_op, kBlockK, k_head + j0 * ldk,
                       ldk, 1.0f, dq_st.data() + at * hd, hd);
            block_gemm(Trans::yes, Trans::no, cols, hd, m, 1.0f, ds_op, kBlockK, q_blk, hd, 1.0f,
                       dk_acc.data(), hd);
          }
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t row = ((b * s.seq_kv + j0 + c) * KV + kvh) * hd;
            std::memcpy(dk + row, dk_acc.data() + c * hd, hd * sizeof(float));
            std::memcpy(dv + row, dv_acc.data() + c * hd, hd * sizeof(float));
          }
        }
        for (int64_t i0 = 0; i0 < s.seq_q; i0 += kBlockQ) {
          const int64_t rows = std::min(kBlockQ, s.seq_q - i0);
          scatter_query_heads(dq + base, dq_st.data() + G * i0 * hd, i0, rows, kvh, G, H, hd);
        }
      }
    }
  }
}

}  // namespace

void attention_backward_blockwise(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, const AttentionShape& s) {
  attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, s);
}

void attention_backward_blockwise_bf16(float* dq, float* dk, float* dv, const float* dout,
                                       const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                       const uint16_t* out, const float* lse,
                                       const AttentionShape& s) {
  attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, s);
}

}  // namespace titan
