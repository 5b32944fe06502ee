#include "titan/core/allocator.h"
#include "titan/dispatch/device_ops.h"
#include "titan/dispatch/registry.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/bias.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/lora_dropout.h"
#include "titan/ops/lora_experts.h"
#include "titan/ops/moe.h"

namespace titan {

const DeviceOps& device_ops() {
  return kernel_registry().device_ops(backend().kind());
}

DeviceOps cpu_device_ops() {
  DeviceOps ops;
  ops.device = DeviceKind::cpu;
  ops.add = add_into;
  // One way to zero memory: the space's (a Buffer's zero is the same call).
  ops.zero = [](float* x, int64_t n) {
    host_memory().zero(x, sizeof(float) * static_cast<size_t>(n));
  };
  ops.scale = scale_in_place;
  ops.sum_squares = sum_squares_f64;
  ops.find_nonfinite = find_nonfinite;
  ops.round_to_bf16 = round_to_bf16;
  ops.widen_bf16 = widen_bf16;
  ops.round_to_bf16_keeping = round_to_bf16_keeping;
  ops.bias_forward = bias_forward;
  ops.bias_backward = bias_backward;
  ops.gemv = gemv_forward;
  ops.rope_cache = rope_cache_build;
  ops.load_balancing_accumulate = load_balancing_accumulate;
  ops.load_balancing_loss = load_balancing_loss;
  ops.load_balancing_grad = load_balancing_grad;
  ops.expert_lora_merge = expert_lora_merge;
  ops.expert_lora_backward = expert_lora_backward;
  ops.lora_dropout = lora_dropout_apply;
  ops.transpose = transpose;
  ops.adamw_step = [](float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                      const AdamWConfig& config, float lr, int64_t step) {
    adamw_update(param, grad, exp_avg, exp_avg_sq, n, adamw_scalars(config, lr, step));
  };
  // The step-wide forms array by array: the same calls, in the same order, as the optimizer
  // made one by one before them (the CPU's bits unchanged).
  ops.sum_squares_all = [](std::span<const AdamWArrays> arrays) {
    double sum = 0.0;
    for (const AdamWArrays& a : arrays) sum += sum_squares_f64(a.grad, a.n);
    return sum;
  };
  ops.adamw_step_all = [](std::span<const AdamWArrays> arrays, const AdamWConfig& config, float lr,
                          int64_t step, float grad_scale) {
    if (grad_scale != 1.0f) {
      for (const AdamWArrays& a : arrays) scale_in_place(a.grad, grad_scale, a.n);
    }
    const AdamWScalars s = adamw_scalars(config, lr, step);
    for (const AdamWArrays& a : arrays) {
      adamw_update(a.param, a.grad, a.exp_avg, a.exp_avg_sq, a.n, s);
    }
  };
  ops.round_to_bf16_all = [](std::span<const Bf16Cast> casts) {
    for (const Bf16Cast& c : casts) round_to_bf16(c.dst, c.src, c.n);
  };
  return ops;
}

}  // namespace titan
