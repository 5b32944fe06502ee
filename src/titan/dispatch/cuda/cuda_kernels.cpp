// The CUDA library's kernels, registered with the registry beside the CPU's (built into titan_cuda
// with -DTITAN_CUDA=ON): each entry with DeviceKind::cuda, its dtypes and the same contract (and
// fp32 reference) as the CPU op of its kind; the default kernel of each op kind on CUDA; and the
// CUDA DeviceOps. The kernels live in src/titan/ops/cuda/ (cuda_ops.h). The MoE kinds' kernels
// (issue 41's milestone 2: the router, dispatch, grouped compute, combine and the staged experts)
// and the load-balancing DeviceOps are compiled and host-tested, not yet run on a GPU; so are the
// decode step's GEMVs. The DeviceOps neither a training step nor a decode step reaches (LoRA on
// experts) fail by name.
#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/registry.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/linear.h"
#include "titan/ops/moe.h"

namespace titan {
namespace {

[[noreturn]] void missing(const char* op) {
  fail("device op '", op, "' is not implemented on CUDA yet");
}

DeviceOps cuda_device_ops() {
  DeviceOps ops;
  ops.device = DeviceKind::cuda;
  ops.add = cuda_ops::add_into;
  // One way to zero memory: the space's (a Buffer's zero is the same call).
  ops.zero = [](float* x, int64_t n) {
    backend().memory().zero(x, sizeof(float) * static_cast<size_t>(n));
  };
  ops.scale = cuda_ops::scale_in_place;
  ops.sum_squares = cuda_ops::sum_squares_f64;
  ops.find_nonfinite = cuda_ops::find_nonfinite;
  ops.round_to_bf16 = cuda_ops::round_to_bf16;
  ops.widen_bf16 = cuda_ops::widen_bf16;
  ops.round_to_bf16_keeping = cuda_ops::round_to_bf16_keeping;
  ops.bias_forward = cuda_ops::bias_forward;
  ops.bias_backward = cuda_ops::bias_backward;
  ops.gemv = cuda_ops::gemv_forward;
  ops.rope_cache = cuda_ops::rope_cache_build;
  ops.load_balancing_accumulate = cuda_ops::load_balancing_accumulate;
  // The loss is arithmetic over the host's E statistics: the CPU's function.
  ops.load_balancing_loss = load_balancing_loss;
  ops.load_balancing_grad = cuda_ops::load_balancing_grad;
  ops.expert_lora_merge = [](float*, const float*, const float*, const float*,
                             const ExpertLoraShape&) { missing("expert_lora_merge"); };
  ops.expert_lora_backward = [](float*, float*, const float*, const float*, const float*,
                                const ExpertLoraShape&) { missing("expert_lora_backward"); };
  ops.lora_dropout = cuda_ops::lora_dropout;
  ops.transpose = cuda_ops::transpose;
  ops.adamw_step = [](float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                      const AdamWConfig& config, float lr, int64_t step) {
    cuda_ops::adamw_update(param, grad, exp_avg, exp_avg_sq, n, adamw_scalars(config, lr, step));
  };
  ops.sum_squares_all = cuda_ops::sum_squares_all;
  ops.adamw_step_all = [](std::span<const AdamWArrays> arrays, const AdamWConfig& config, float lr,
                          int64_t step, float grad_scale) {
    cuda_ops::adamw_update_all(arrays, adamw_scalars(config, lr, step), grad_scale);
  };
  ops.round_to_bf16_all = cuda_ops::round_to_bf16_all;
  return ops;
}

KernelEntry cuda_entry(std::string name, OpKind kind, std::vector<DType> dtypes,
                       std::string description, decltype(KernelEntry::impl) impl) {
  return {std::move(name), kind, std::move(dtypes), std::move(description), std::move(impl),
          DeviceKind::cuda};
}

}  // namespace

void register_cuda_kernels(KernelRegistry& r) {
  r.add(cuda_entry("embedding_cuda", OpKind::embedding, {DType::f32},
                   "row gather one thread per element (fp32, or bf16 rows widened); scatter-add "
                   "one thread per column over the "
                   "tokens in order (deterministic)",
                   EmbeddingKernel{cuda_ops::embedding_forward, cuda_ops::embedding_backward,
                                   cuda_ops::embedding_forward_bf16}));
  // ops/linear.h's functions are the backend's GEMMs and nothing else: on CUDA, cuBLASLt (fp32 with
  // TF32 off, bf16 operands with fp32 accumulation).
  r.add(cuda_entry("linear_cuda", OpKind::linear, {DType::f32, DType::bf16},
                   "the backend's GEMMs: cuBLASLt (fp32 without TF32; bf16 operands, fp32 compute)",
                   LinearKernel{linear_forward, linear_backward, linear_forward_bf16,
                                linear_backward_bf16, linear_forward_bf16_to_bf16}));
  r.add(cuda_entry("rms_norm_cuda", OpKind::rms_norm, {DType::f32},
                   "one block per row, fp32 statistics; dweight one thread per column",
                   RmsNormKernel{cuda_ops::rms_norm_forward, cuda_ops::rms_norm_backward}));
  r.add(cuda_entry("rope_cuda", OpKind::rope, {DType::f32},
                   "one thread per rotated pair, the CPU's cos/sin table in device memory",
                   RopeKernel{cuda_ops::rope_forward, cuda_ops::rope_backward}));
  r.add(cuda_entry(
      "attention_cuda_simple", OpKind::attention, {DType::f32, DType::bf16},
      "one block per query row (forward, dq) or key row (dk, dv), scores recomputed "
      "(bf16 forms at the CPU's rounding points); correct first, not fast",
      AttentionKernel{cuda_ops::attention_forward, cuda_ops::attention_backward,
                      cuda_ops::attention_check, nullptr, cuda_ops::attention_backward_bf16,
                      cuda_ops::attention_forward_bf16}));
  // bf16 only: cuDNN's SDPA takes half types, so an fp32 job's slots refuse it (decoder_lm_slots:
  // CUDA's attention slot has the job's compute dtype). The fp32 forms, which the registry
  // requires and a forward that keeps no bf16 q, k, v calls (SelfAttention::forward), are the
  // simple kernel's.
  r.add(cuda_entry("attention_cuda_cudnn", OpKind::attention, {DType::bf16},
                   "cuDNN's fused SDPA (cudnn-frontend) over bf16 q, k, v, fp32 accumulation, "
                   "graphs cached per shape; fp32 forms: attention_cuda_simple's",
                   AttentionKernel{cuda_ops::attention_forward, cuda_ops::attention_backward,
                                   cuda_ops::attention_cudnn_check, nullptr,
                                   cuda_ops::attention_backward_cudnn_bf16,
                                   cuda_ops::attention_forward_cudnn_bf16}));
  r.add(cuda_entry("swiglu_cuda", OpKind::swiglu, {DType::f32},
                   "one thread per element (bf16 recompute and backward too)",
                   SwigluKernel{cuda_ops::swiglu_forward, cuda_ops::swiglu_backward,
                                cuda_ops::swiglu_recompute_bf16, cuda_ops::swiglu_backward_bf16}));
  r.add(cuda_entry("cross_entropy_cuda", OpKind::lm_head_loss, {DType::f32, DType::bf16},
                   "lm_head GEMMs through cuBLASLt per chunk of tokens (bf16 operands and logits "
                   "under bf16), one block per row's softmax",
                   LmHeadLossKernel{cuda_ops::lm_head_cross_entropy, lm_head_chunk_tokens,
                                    cuda_ops::lm_head_workspace_bytes}));
  // MoE (ops/moe_stages.h's stages): the staged experts run the block's stage slots, as the CPU's.
  r.add(
      cuda_entry("experts_staged_cuda", OpKind::experts, {DType::f32, DType::bf16},
                 "route, dispatch, grouped compute and combine: the block runs its stage slots "
                 "(router, moe_dispatch, grouped_experts, moe_combine) on CUDA",
                 ExpertsKernel{cuda_ops::experts_forward_staged, cuda_ops::experts_backward_staged,
                               experts_check_rows, cuda_ops::experts_forward_staged_bf16,
                               cuda_ops::experts_backward_staged_bf16, true}));
  r.add(cuda_entry("router_topk_cuda", OpKind::router, {DType::f32},
                   "softmax and top-k one thread per token (ties: the lower expert)",
                   RouterKernel{cuda_ops::router_topk_forward, cuda_ops::router_topk_backward}));
  r.add(cuda_entry(
      "moe_dispatch_cuda", OpKind::moe_dispatch, {DType::f32, DType::bf16},
      "counting sort one thread per expert (the CPU's row order); gathers and sums one "
      "thread per element (rounded under bf16)",
      MoeDispatchKernel{cuda_ops::moe_dispatch_plan, cuda_ops::moe_dispatch_forward,
                        cuda_ops::moe_dispatch_backward, cuda_ops::moe_dispatch_forward_bf16}));
  r.add(cuda_entry(
      "grouped_experts_cuda", OpKind::grouped_experts, {DType::f32, DType::bf16},
      "three cuBLASLt GEMMs per expert over its rows (bf16 operands under bf16)",
      GroupedExpertsKernel{cuda_ops::grouped_experts_forward, cuda_ops::grouped_experts_backward,
                           cuda_ops::grouped_experts_forward_bf16,
                           cuda_ops::grouped_experts_backward_bf16}));
  r.add(
      cuda_entry("moe_combine_cuda", OpKind::moe_combine, {DType::f32},
                 "weighted sum one thread per element in ascending expert order",
                 MoeCombineKernel{cuda_ops::moe_combine_forward, cuda_ops::moe_combine_backward}));
  r.set_default(OpKind::embedding, DeviceKind::cuda, "embedding_cuda");
  r.set_default(OpKind::linear, DeviceKind::cuda, "linear_cuda");
  r.set_default(OpKind::rms_norm, DeviceKind::cuda, "rms_norm_cuda");
  r.set_default(OpKind::rope, DeviceKind::cuda, "rope_cuda");
  r.set_default(OpKind::attention, DeviceKind::cuda, "attention_cuda_simple");
  r.set_dtype_default(OpKind::attention, DeviceKind::cuda, DType::bf16, "attention_cuda_cudnn");
  r.set_default(OpKind::swiglu, DeviceKind::cuda, "swiglu_cuda");
  r.set_default(OpKind::lm_head_loss, DeviceKind::cuda, "cross_entropy_cuda");
  r.set_default(OpKind::experts, DeviceKind::cuda, "experts_staged_cuda");
  r.set_default(OpKind::router, DeviceKind::cuda, "router_topk_cuda");
  r.set_default(OpKind::moe_dispatch, DeviceKind::cuda, "moe_dispatch_cuda");
  r.set_default(OpKind::grouped_experts, DeviceKind::cuda, "grouped_experts_cuda");
  r.set_default(OpKind::moe_combine, DeviceKind::cuda, "moe_combine_cuda");
  r.add_device_ops(cuda_device_ops());
}

}  // namespace titan
