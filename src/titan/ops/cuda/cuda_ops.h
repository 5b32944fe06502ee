// The CUDA kernels' host entry points, each with the contract of the CPU op of the same name
// (ops/*.h), every pointer into device memory (the CUDA backend's). Registered for
// DeviceKind::cuda by dispatch/cuda/cuda_kernels.cpp; defined in this folder's .cu files. (The
// linear needs no kernel of its own: ops/linear.h's functions call the backend's GEMMs, cuBLASLt
// there.) Plain C++ declarations: no CUDA header.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "titan/ops/adamw.h"
#include "titan/ops/attention.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/gemv.h"
#include "titan/ops/lora_dropout.h"
#include "titan/ops/moe.h"
#include "titan/ops/rope.h"

namespace titan::cuda_ops {

// rms_norm.cu
void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t rows,
                      int64_t dim, float eps);
void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t dim);

// rope.cu; the cache's table in device memory (rope_cache_build).
void rope_forward(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                  int64_t n_heads);
void rope_backward(float* dx, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                   int64_t n_heads);
RopeCache rope_cache_build(const RopeParams& rope, int64_t max_positions);

// swiglu.cu
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);
void swiglu_recompute_bf16(uint16_t* act, const uint16_t* gate, const uint16_t* up, int64_t n);
void swiglu_backward_bf16(uint16_t* dgate, uint16_t* dup, const float* dout, const uint16_t* gate,
                          const uint16_t* up, int64_t n);

// embedding.cu
void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t n_tokens,
                       int64_t vocab, int64_t dim);
void embedding_forward_bf16(float* out, const int32_t* ids, const uint16_t* weight,
                            int64_t n_tokens, int64_t vocab, int64_t dim);
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t n_tokens,
                        int64_t dim);

// attention.cu (no packed rows); the bf16 forms over mixed-precision training's bf16 q, k, v and
// out (ops/attention.h's *_blockwise_bf16 rounding points).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& s);
void attention_forward_bf16(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                            const uint16_t* v, const AttentionShape& s);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const uint16_t* q,
                             const uint16_t* k, const uint16_t* v, const uint16_t* out,
                             const float* lse, const AttentionShape& s);
// Empty when the kernel runs `s`, else what it requires.
std::string attention_check(const AttentionShape& s);

// attention_cudnn.cpp: cuDNN's fused SDPA over bf16 q, k, v (and out), mixed-precision training's
// forms with the bf16 signatures above; the forward's out and the backward's dq, dk, dv come from
// cuDNN in bf16, widened (attention_cudnn_plan.h). Graphs built once per shape and cached.
void attention_forward_cudnn_bf16(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, const AttentionShape& s);
void attention_backward_cudnn_bf16(float* dq, float* dk, float* dv, const float* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse, const AttentionShape& s);
// Empty when cuDNN's kernel runs `s` (square causal, head_dim 64-256 in steps of 8), else what it
// requires.
std::string attention_cudnn_check(const AttentionShape& s);

// cross_entropy.cu (fp32, and bf16 with the lm_head's bf16 copy): the lm_head GEMMs through the
// backend, a chunk of tokens at a time.
CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& args);
int64_t lm_head_workspace_bytes(int64_t n_tokens, int64_t hidden, int64_t vocab,
                                int64_t chunk_tokens, bool bf16);

// arrays.cu: DeviceOps' whole-array work (dispatch/device_ops.h's contracts).
void add_into(float* y, const float* x, int64_t n);
void scale_in_place(float* x, float a, int64_t n);
double sum_squares_f64(const float* x, int64_t n);
int64_t find_nonfinite(const float* x, int64_t n);
void round_to_bf16(uint16_t* dst, const float* x, int64_t n);
void widen_bf16(float* dst, const uint16_t* x, int64_t n);
void round_to_bf16_keeping(float* values, uint16_t* bits, int64_t n);
void bias_forward(float* y, const float* bias, int64_t rows, int64_t out_features);
void bias_backward(float* dbias, const float* dy, int64_t rows, int64_t out_features);
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWScalars& scalars);

// moe_route.cu: the router (ops/moe.h), and the load-balancing DeviceOps: counts and prob_sums
// (E) are the host's running totals, probs and index device memory; dprobs (E) device memory.
void router_topk_forward(int32_t* index, float* weight, float* probs, const float* logits,
                         int64_t n_tokens, int64_t n_experts, int64_t top_k, bool norm_topk_prob);
void router_topk_backward(float* dlogits, const float* dweight, const float* dprobs_all,
                          const float* probs, const int32_t* index, int64_t n_tokens,
                          int64_t n_experts, int64_t top_k, bool norm_topk_prob);
void load_balancing_accumulate(double* counts, double* prob_sums, const float* probs,
                               const int32_t* index, int64_t n_tokens, int64_t n_experts,
                               int64_t top_k);
void load_balancing_grad(float* dprobs, const double* counts, int64_t n_experts, int64_t rows,
                         double scale);

// moe_dispatch.cu: dispatch and combine (ops/moe_stages.h).
void moe_dispatch_plan(int32_t* row_of, int32_t* offsets, const int32_t* index,
                       const ExpertsShape& shape);
void moe_dispatch_forward(float* x_rows, const float* x, const int32_t* row_of,
                          const ExpertsShape& shape);
void moe_dispatch_forward_bf16(uint16_t* x_rows, const float* x, const int32_t* row_of,
                               const ExpertsShape& shape);
void moe_dispatch_backward(float* dx, float* dweight, const float* dx_rows,
                           const float* dweight_rows, const int32_t* row_of,
                           const ExpertsShape& shape);
void moe_combine_forward(float* y, const float* out_rows, const int32_t* row_of,
                         const int32_t* index, const float* weight, const ExpertsShape& shape);
void moe_combine_backward(float* dy_rows, float* w_rows, const float* dy, const float* weight,
                          const int32_t* row_of, const ExpertsShape& shape);

// moe_experts.cu: the grouped compute (ops/moe_stages.h), and the four stages composed under the
// fused experts' contract (ops/moe.h's experts_*_staged).
void grouped_experts_forward(float* out_rows, const ExpertsActivations& act,
                             const ExpertsScratch& s, const float* x_rows, const int32_t* offsets,
                             const ExpertWeights& w, const ExpertsShape& shape);
void grouped_experts_backward(float* rows, float* dweight_rows, const ExpertGrads& dw,
                              const ExpertsScratch& s, const float* w_rows,
                              const ExpertsActivations& act, const float* x_rows,
                              const int32_t* offsets, const ExpertWeights& w,
                              const ExpertsShape& shape);
void grouped_experts_forward_bf16(float* out_rows, const ExpertsActivations& act,
                                  const ExpertsScratch& s, const uint16_t* x_rows,
                                  const int32_t* offsets, const ExpertWeightsBf16& w,
                                  const ExpertsShape& shape);
void grouped_experts_backward_bf16(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                   const ExpertsScratch& s, const float* w_rows,
                                   const ExpertsActivations& act, const uint16_t* x_rows,
                                   const int32_t* offsets, const ExpertWeightsBf16& w,
                                   const ExpertsShape& shape);
void experts_forward_staged(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                            const float* x, const int32_t* index, const float* weight,
                            const ExpertWeights& w, const ExpertsShape& shape);
void experts_backward_staged(float* dx, float* dweight, const ExpertGrads& dw,
                             const ExpertsScratch& s, const float* dy,
                             const ExpertsActivations& act, const float* x, const int32_t* index,
                             const float* weight, const ExpertWeights& w,
                             const ExpertsShape& shape);
void experts_forward_staged_bf16(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                                 const float* x, const int32_t* index, const float* weight,
                                 const ExpertWeightsBf16& w, const ExpertsShape& shape);
void experts_backward_staged_bf16(float* dx, float* dweight, const ExpertGrads& dw,
                                  const ExpertsScratch& s, const float* dy,
                                  const ExpertsActivations& act, const float* x,
                                  const int32_t* index, const float* weight,
                                  const ExpertWeightsBf16& w, const ExpertsShape& shape);

// gemv.cu: the decode step's one-token products (ops/gemv.h's contract; fp32 and bf16 weights).
void gemv_forward(std::span<const GemvProduct> products, const float* x);

// lora.cu: DeviceOps::lora_dropout (ops/lora_dropout.h's mask, bit for bit) and
// DeviceOps::transpose (LoRA's B^T).
void lora_dropout(float* dst, const float* x, int64_t n, int64_t features,
                  const LoraDropoutCall& call, bool accumulate);
void transpose(float* dst, const float* src, int64_t rows, int64_t cols);

// step_arrays.cu: the step-wide forms over every parameter array at once (DeviceOps'
// sum_squares_all and adamw_step_all; the gradients left unscaled).
double sum_squares_all(std::span<const AdamWArrays> arrays);
void adamw_update_all(std::span<const AdamWArrays> arrays, const AdamWScalars& scalars,
                      float grad_scale);
void round_to_bf16_all(std::span<const Bf16Cast> casts);

}  // namespace titan::cuda_ops
