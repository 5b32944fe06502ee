// The computations above the ops that no [overrides] rule rebinds: whole-array arithmetic
// (residual adds, zeroing gradients, FSDP's gradient sums, clipping, norms), dtype casts, bias, the
// fused one-token GEMVs, the RoPE table, the router's load-balancing statistics, LoRA's merge into
// stacked experts and its gradients, and AdamW (the
// router's softmax and top-k is a kernel kind of its own, `router`). One table per device,
// registered with the kernel registry beside the device's kernels (the CPU's by the registry
// itself; CUDA's through register_cuda_kernels, dispatch/registry.h), so a new device is a new
// table, never a branch inside a module. Code above dispatch/ reaches the running backend's table
// through device_ops() and never calls a function of src/titan/ops directly
// (scripts/check-layering.sh checks it).
#pragma once

#include <cstdint>
#include <span>

#include "titan/backend/backend.h"
#include "titan/dispatch/kernel_fn.h"
#include "titan/ops/adamw.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/gemv.h"
#include "titan/ops/lora_dropout.h"
#include "titan/ops/lora_experts.h"
#include "titan/ops/rope.h"

namespace titan {

struct DeviceOps {
  DeviceKind device = DeviceKind::cpu;
  // y (n) += x (n).
  KernelFn<void (*)(float* y, const float* x, int64_t n), "add"> add;
  // x (n) = 0 (a step's gradients: memory work, timed as a kernel in profiles): the backend's
  // memory space zeroes it, as it does a whole Buffer (Buffer::zero), so there is one way.
  KernelFn<void (*)(float* x, int64_t n), "zero"> zero;
  // x (n) *= a.
  KernelFn<void (*)(float* x, float a, int64_t n), "scale"> scale;
  // sum_i x[i]^2 (n) in fp64.
  KernelFn<double (*)(const float* x, int64_t n), "sum_squares"> sum_squares;
  // The index of the first NaN or infinity of x (n), or -1.
  KernelFn<int64_t (*)(const float* x, int64_t n), "find_nonfinite"> find_nonfinite;
  // dst (n) = x (n) rounded to bf16 (raw bits), to nearest, ties to even.
  KernelFn<void (*)(uint16_t* dst, const float* x, int64_t n), "round_to_bf16"> round_to_bf16;
  // dst (n) = x (n, bf16 bits) widened exactly.
  KernelFn<void (*)(float* dst, const uint16_t* x, int64_t n), "widen_bf16"> widen_bf16;
  // values (n) replaced by their bf16 roundings, whose bits also go to `bits` (n) unless null.
  KernelFn<void (*)(float* values, uint16_t* bits, int64_t n), "round_to_bf16_keeping">
      round_to_bf16_keeping;
  // y (rows, out) += bias (out) per row; dbias (out) += the column sums of dy (rows, out).
  KernelFn<void (*)(float* y, const float* bias, int64_t rows, int64_t out_features),
           "bias_forward">
      bias_forward;
  KernelFn<void (*)(float* dbias, const float* dy, int64_t rows, int64_t out_features),
           "bias_backward">
      bias_backward;
  // One token's products sharing x (ops/gemv.h).
  KernelFn<void (*)(std::span<const GemvProduct> products, const float* x), "gemv"> gemv;
  // The cos/sin table of positions [0, max_positions).
  KernelFn<RopeCache (*)(const RopeParams& rope, int64_t max_positions), "rope_cache"> rope_cache;
  // The load-balancing loss's statistics over (tokens, experts) router rows, the loss from them
  // and its per-expert gradient (ops/moe.h). counts and prob_sums are host memory (the model's
  // running totals, which collectives sum), probs and index the device's; dprobs is the device's
  // (the router kernels read it).
  KernelFn<void (*)(double* counts, double* prob_sums, const float* probs, const int32_t* index,
                    int64_t n_tokens, int64_t n_experts, int64_t top_k),
           "load_balancing_accumulate">
      load_balancing_accumulate;
  KernelFn<double (*)(const double* counts, const double* prob_sums, int64_t n_experts,
                      int64_t rows),
           "load_balancing_loss">
      load_balancing_loss;
  KernelFn<void (*)(float* dprobs, const double* counts, int64_t n_experts, int64_t rows,
                    double scale),
           "load_balancing_grad">
      load_balancing_grad;
  // LoRA on stacked experts (ops/lora_experts.h): the merged weight, and A's and B's gradients
  // from the merged weight's.
  KernelFn<void (*)(float* w_merged, const float* w, const float* a, const float* b,
                    const ExpertLoraShape& shape),
           "expert_lora_merge">
      expert_lora_merge;
  KernelFn<void (*)(float* da, float* db, const float* dw, const float* a, const float* b,
                    const ExpertLoraShape& shape),
           "expert_lora_backward">
      expert_lora_backward;
  // LoRA's dropout on the adapter's input (ops/lora_dropout.h): dst (n, features) = x masked and
  // scaled, or dst += that when accumulating (the backward's dx share).
  KernelFn<void (*)(float* dst, const float* x, int64_t n, int64_t features,
                    const LoraDropoutCall& call, bool accumulate),
           "lora_dropout">
      lora_dropout;
  // dst (cols, rows) = src (rows, cols) transposed, exactly (LoRA's B^T).
  KernelFn<void (*)(float* dst, const float* src, int64_t rows, int64_t cols), "transpose">
      transpose;
  // AdamW update number `step` (1-based) at `lr` of param, exp_avg, exp_avg_sq (n) from grad (n).
  KernelFn<void (*)(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                    const AdamWConfig& config, float lr, int64_t step),
           "adamw_step">
      adamw_step;
  // The gradient norm's fp64 sum of squares over every array's grad: each array's sum_squares,
  // added in the arrays' order (on CUDA one launch per 32 arrays, the blocks' sums added on the
  // host).
  KernelFn<double (*)(std::span<const AdamWArrays> arrays), "sum_squares_all"> sum_squares_all;
  // adamw_step over every array, each grad first multiplied by grad_scale (clipping's coefficient;
  // 1 leaves it) as `scale` would round it. The CPU scales grad in place, then updates array by
  // array; CUDA does both in one launch per 32 arrays and leaves grad unscaled (nothing reads it
  // after the step but the next step's zeroing).
  KernelFn<void (*)(std::span<const AdamWArrays> arrays, const AdamWConfig& config, float lr,
                    int64_t step, float grad_scale),
           "adamw_step_all">
      adamw_step_all;
  // round_to_bf16 of every cast (a unit's bf16 weight copies), in order; on CUDA one launch per
  // 32 casts.
  KernelFn<void (*)(std::span<const Bf16Cast> casts), "round_to_bf16_all"> round_to_bf16_all;
};

// The table of the running backend's device (backend().kind()); titan::Error when none is
// registered for it.
const DeviceOps& device_ops();

// The CPU's table (dispatch/device_ops_cpu.cpp), which the registry registers.
DeviceOps cpu_device_ops();

}  // namespace titan
