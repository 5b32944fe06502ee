// The computations above the ops that no [overrides] rule rebinds: whole-array arithmetic
// (residual adds, FSDP's gradient sums, clipping, norms), dtype casts, bias, the fused one-token
// GEMVs, the RoPE table, the router's load-balancing statistics and AdamW (the router's softmax
// and top-k is a kernel kind of its own, `router`). One table per device,
// registered with the kernel registry beside the device's kernels (the CPU's by the registry
// itself; CUDA's through register_cuda_kernels, dispatch/registry.h), so a new device is a new
// table, never a branch inside a module. Code above dispatch/ reaches the running backend's table
// through device_ops() and never calls a function of src/titan/ops directly
// (scripts/check-layering.sh checks it).
#pragma once

#include <cstdint>
#include <span>

#include "titan/backend/backend.h"
#include "titan/ops/adamw.h"
#include "titan/ops/gemv.h"
#include "titan/ops/rope.h"

namespace titan {

struct DeviceOps {
  DeviceKind device = DeviceKind::cpu;
  // y (n) += x (n).
  void (*add)(float* y, const float* x, int64_t n);
  // x (n) *= a.
  void (*scale)(float* x, float a, int64_t n);
  // sum_i x[i]^2 (n) in fp64.
  double (*sum_squares)(const float* x, int64_t n);
  // The index of the first NaN or infinity of x (n), or -1.
  int64_t (*find_nonfinite)(const float* x, int64_t n);
  // dst (n) = x (n) rounded to bf16 (raw bits), to nearest, ties to even.
  void (*round_to_bf16)(uint16_t* dst, const float* x, int64_t n);
  // dst (n) = x (n, bf16 bits) widened exactly.
  void (*widen_bf16)(float* dst, const uint16_t* x, int64_t n);
  // values (n) replaced by their bf16 roundings, whose bits also go to `bits` (n) unless null.
  void (*round_to_bf16_keeping)(float* values, uint16_t* bits, int64_t n);
  // y (rows, out) += bias (out) per row; dbias (out) += the column sums of dy (rows, out).
  void (*bias_forward)(float* y, const float* bias, int64_t rows, int64_t out_features);
  void (*bias_backward)(float* dbias, const float* dy, int64_t rows, int64_t out_features);
  // One token's products sharing x (ops/gemv.h).
  void (*gemv)(std::span<const GemvProduct> products, const float* x);
  // The cos/sin table of positions [0, max_positions).
  RopeCache (*rope_cache)(const RopeParams& rope, int64_t max_positions);
  // The load-balancing loss's statistics over (tokens, experts) router rows, the loss from them
  // and its per-expert gradient (ops/moe.h).
  void (*load_balancing_accumulate)(double* counts, double* prob_sums, const float* probs,
                                    const int32_t* index, int64_t n_tokens, int64_t n_experts,
                                    int64_t top_k);
  double (*load_balancing_loss)(const double* counts, const double* prob_sums, int64_t n_experts,
                                int64_t rows);
  void (*load_balancing_grad)(float* dprobs, const double* counts, int64_t n_experts, int64_t rows,
                              double scale);
  // AdamW update number `step` (1-based) at `lr` of param, exp_avg, exp_avg_sq (n) from grad (n).
  void (*adamw_step)(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const AdamWConfig& config, float lr, int64_t step);
};

// The table of the running backend's device (backend().kind()); titan::Error when none is
// registered for it.
const DeviceOps& device_ops();

// The CPU's table (dispatch/device_ops_cpu.cpp), which the registry registers.
DeviceOps cpu_device_ops();

}  // namespace titan
