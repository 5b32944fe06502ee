// The row-level vector primitives every backend hands the ops (Backend::vec()): a table of
// function pointers, fetched once per op call, so the per-row calls inside an op's loops are
// plain indirect calls, not virtual ones. The CPU's tables are backend/cpu/vec.h; a backend
// without a kernel for a primitive puts there a function that throws titan::Error naming it.
#pragma once

#include <cstdint>

namespace titan {

// One AdamW update's scalars (PyTorch's AdamW: decoupled decay, bias correction).
struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};

// The heads of a grouped-query attention's cache rows: kv_heads slices of head_dim values per row,
// each shared by `group` consecutive query heads (query head h reads kv head h / group).
struct GqaHeads {
  int64_t kv_heads, group, head_dim;
};

struct VecKernels {
  // What this table was compiled for: the CPU's ISA ("scalar", "avx2", "avx512": isa_name in
  // backend/cpu/cpu_info.h), or another backend's name.
  const char* variant;
  // max_i x[i]; -inf for n == 0.
  float (*max)(const float* x, int64_t n);
  // y[i] = exp(x[i] - shift), returns sum_i y[i]. y may alias x.
  float (*exp_shift_sum)(float* y, const float* x, int64_t n, float shift);
  // The same two over bf16 x (raw bits), widened in registers, exactly: a row of bf16 logits
  // needs no fp32 copy before its softmax.
  float (*max_bf16)(const uint16_t* x, int64_t n);
  float (*exp_shift_sum_bf16)(float* y, const uint16_t* x, int64_t n, float shift);
  float (*sum_squares)(const float* x, int64_t n);
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] *= a
  void (*scale)(float* y, float a, int64_t n);
  // y[i] += a * x[i]
  void (*axpy)(float* y, float a, const float* x, int64_t n);
  // y[i] = w[i] * (x[i] * s)  (RMSNorm: normalise, then weight, in HF's order)
  void (*scale_mul)(float* y, const float* x, float s, const float* w, int64_t n);
  // out[i] = silu(gate[i]) * up[i]
  void (*silu_mul)(float* out, const float* gate, const float* up, int64_t n);
  // Gradients of silu_mul with respect to gate and up.
  void (*silu_mul_backward)(float* dgate, float* dup, const float* dout, const float* gate,
                            const float* up, int64_t n);
  void (*adamw)(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWScalars& s);
  // dst[i] = bf16(x[i] * scale) as raw bits: the fp32 product rounded to nearest, ties to even;
  // NaN stays NaN (quieted), infinities and subnormals as core/dtype.h's f32_to_bf16 keeps them.
  // The mixed-precision ops' operands and kept activations.
  void (*round_to_bf16)(uint16_t* dst, const float* x, float scale, int64_t n);
  // dst[i] = x[i] (raw bf16 bits) widened to fp32, exactly.
  void (*widen_bf16)(float* dst, const uint16_t* x, int64_t n);
  // y[r] = sum_c w[r * ldw + c] * x[c] for r < rows, c < cols: a matrix-vector product over
  // rows of weights ldw apart (cols for a whole matrix), fp32 accumulation.
  void (*gemv_f32)(float* y, const float* w, int64_t ldw, const float* x, int64_t rows,
                   int64_t cols);
  // The same with bf16 weights (their raw bits), widened to fp32 in registers -- exactly, since
  // bf16 is the top half of an fp32 -- so half the bytes stream from memory. x comes split by
  // gemv_bf16_split_x (its pairs of columns apart, which lets the kernel widen without shuffles)
  // and must hold bf16 values (x rounded, as gemv_forward gives it): with AVX512_BF16 the
  // kernel multiplies them as bf16.
  void (*gemv_bf16)(float* y, const uint16_t* w, int64_t ldw, const float* x_split, int64_t rows,
                    int64_t cols);
  // y_split += a * x for bf16 x (raw bits), y in gemv_bf16_split_x's layout: x widened by the
  // even/odd split of gemv_bf16, no shuffles (attention's values read from a bf16 KV cache; the
  // sum is unsplit once at the end).
  void (*axpy_bf16)(float* y_split, float a, const uint16_t* x, int64_t n);
  // y[c] += sum_r a[r] * x[r * ldx + c] for c < cols: the rows of x, weighted by a, summed into y
  // (attention's probabilities times its values).
  void (*axpy_rows)(float* y, const float* a, const float* x, int64_t ldx, int64_t rows,
                    int64_t cols);
  // One query's attention scores over `rows` cache rows ldk apart, every head:
  // scores[h * lds + r] = sum_c q[h * head_dim + c] * k[r * ldk + (h / group) * head_dim + c]
  // for h < kv_heads * group. Rows are read in order, each kv head's slice once for the group of
  // query heads sharing it (a decode step's keys; one call per thread's range of the cache).
  void (*gqa_scores_f32)(float* scores, int64_t lds, const float* q, const float* k, int64_t ldk,
                         int64_t rows, const GqaHeads& heads);
  // The same over bf16 keys (raw bits), each head of q split by gemv_bf16_split_x.
  void (*gqa_scores_bf16)(float* scores, int64_t lds, const float* q_split, const uint16_t* k,
                          int64_t ldk, int64_t rows, const GqaHeads& heads);
  // The weighted sum of value rows: out[h * head_dim + c] += sum_r p[h * ldp + r] *
  // v[r * ldv + (h / group) * head_dim + c], rows added in order, each kv head's slice read once
  // for its group.
  void (*gqa_values_f32)(float* out, const float* p, int64_t ldp, const float* v, int64_t ldv,
                         int64_t rows, const GqaHeads& heads);
  // The same over bf16 values (raw bits), each head of out in gemv_bf16_split_x's layout.
  void (*gqa_values_bf16)(float* out_split, const float* p, int64_t ldp, const uint16_t* v,
                          int64_t ldv, int64_t rows, const GqaHeads& heads);
  // fp32 lanes of this ISA's widest vector.
  int native_lanes;
  // `rounds` of kFmaProbeChains independent vector FMA chains (acc = acc * m + a) on the widest
  // vectors; returns a value that depends on every chain. The peak FLOP rate is timed on it
  // (backend/cpu/peak.h).
  float (*fma_chains)(int64_t rounds);
};

constexpr int kFmaProbeChains = 12;

// gemv_bf16's x layout: each whole block of 32 columns as its 16 even-indexed elements, then its
// 16 odd ones; the columns after the last whole block in place. x_split (cols) must not alias x.
void gemv_bf16_split_x(float* x_split, const float* x, int64_t cols);
// Its inverse: x (cols) back in column order. x must not alias x_split.
void gemv_bf16_unsplit_x(float* x, const float* x_split, int64_t cols);

}  // namespace titan
