// Host-side, no GPU needed: every kernel a training step of the tiny Qwen3 and of the tiny
// Qwen3-MoE binds on CUDA, in fp32 and in bf16 mixed precision, has a registration for
// DeviceKind::cuda (dispatch/cuda/cuda_kernels.cpp) that takes the slot's dtype and the step's
// shapes -- the slots DecoderLM builds on CUDA (decoder_lm_default_slots), checked as a model's are
// before anything is allocated (apply_overrides with no rules, then the kernels' constraints) --
// and, under bf16, the bf16 forms the CPU's step runs at its rounding points (attention's forward
// and backward over bf16 q, k, v; SwiGLU's recompute and backward; the MoE dispatch's rounded
// gather and the grouped experts' bf16 GEMMs; the loss's bf16 GEMMs are its bf16 dtype); and CUDA
// has its DeviceOps table (the residual adds, zeroing, clipping and norms, the bf16 casts, the
// RoPE table, the load-balancing statistics, AdamW, and what a dense LoRA step adds: LoRA's
// dropout and B's transpose); and what a decode step binds (check_decode).
// The check is shown able to fail: the tiny Qwen3-MoE with its experts bound to a CPU kernel (an
// [overrides] rule) must be refused naming it. Prints each slot's kernel; exit 1 with the reason
// otherwise. A build without CUDA registers no CUDA kernel: it fails there.
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"
#include "titan/dispatch/overrides.h"
#include "titan/dispatch/registry.h"
#include "titan/models/decoder_lm_slots.h"
#include "titan/models/qwen3/flavors.h"

namespace {

using namespace titan;

// The bf16 forms a bf16 step calls through `entry` where the CPU's kernel of its kind has them,
// missing ones named.
void check_bf16_forms(const KernelSlot& slot, const KernelEntry& entry) {
  if (const auto* a = std::get_if<AttentionKernel>(&entry.impl)) {
    TITAN_CHECK(a->forward_bf16 != nullptr && a->backward_bf16 != nullptr, slot.module,
                ": attention kernel ", slot.kernel,
                " has no bf16 forward and backward (the bf16 step would widen q, k and v)");
  }
  if (const auto* s = std::get_if<SwigluKernel>(&entry.impl)) {
    TITAN_CHECK(s->recompute_bf16 != nullptr && s->backward_bf16 != nullptr, slot.module,
                ": SwiGLU kernel ", slot.kernel, " has no bf16 recompute and backward");
  }
  if (const auto* e = std::get_if<ExpertsKernel>(&entry.impl)) {
    TITAN_CHECK(e->forward_bf16 != nullptr && e->backward_bf16 != nullptr, slot.module,
                ": experts kernel ", slot.kernel, " has no bf16 forward and backward");
  }
  if (const auto* d = std::get_if<MoeDispatchKernel>(&entry.impl)) {
    TITAN_CHECK(d->forward_bf16 != nullptr, slot.module, ": MoE dispatch kernel ", slot.kernel,
                " has no bf16 gather (the grouped GEMMs' rounded rows)");
  }
  if (const auto* g = std::get_if<GroupedExpertsKernel>(&entry.impl)) {
    TITAN_CHECK(g->forward_bf16 != nullptr && g->backward_bf16 != nullptr, slot.module,
                ": grouped experts kernel ", slot.kernel, " has no bf16 forward and backward");
  }
}

void check_step(const char* model, DType compute, const std::vector<OverrideRule>& rules = {}) {
  const ModelArgs args = flavor(model);
  const KernelRegistry& registry = kernel_registry();
  std::vector<KernelSlot> slots = decoder_lm_default_slots(args, compute, DeviceKind::cuda);
  apply_overrides(slots, rules, registry);
  // scripts/cuda-device-check.sh's step: 2 rows of 64 tokens.
  check_decoder_lm_slot_constraints(slots, args, 2, 64);
  std::map<std::string, int> bound;  // kernel -> slots
  for (const KernelSlot& s : slots) {
    const KernelEntry& entry = registry.get(s.kernel, s.kind);
    TITAN_CHECK(entry.device == DeviceKind::cuda, s.module, ": kernel ", s.kernel, " runs on ",
                device_kind_name(entry.device), ", not cuda");
    if (compute == DType::bf16) check_bf16_forms(s, entry);
    ++bound[s.kernel];
  }
  std::printf("%s %s step:\n", model, std::string(dtype_name(compute)).c_str());
  for (const auto& [kernel, count] : bound)
    std::printf("  %-24s %d slots\n", kernel.c_str(), count);
}

// What a decode step (titan generate --device cuda: InferenceSession, one token against the KV
// cache) binds on CUDA: every linear on CUDA's default linear kernel, so that one token's products
// take the device's fused GEMVs (nn/layers.cpp's linear_group_forward), which CUDA's DeviceOps
// table must have (called here with no product, where the CUDA kernel returns before touching the
// device and a missing op throws); the attention kernel runs one query over 512 cached keys, and
// under bf16 weights (a bf16 KV cache by default) reads bf16 q, k and v (forward_bf16).
void check_decode(const ModelArgs& args, DType compute) {
  const KernelRegistry& registry = kernel_registry();
  std::vector<KernelSlot> slots = decoder_lm_default_slots(args, compute, DeviceKind::cuda);
  apply_overrides(slots, {}, registry);
  const std::string& linear = registry.default_kernel(OpKind::linear, DeviceKind::cuda);
  for (const KernelSlot& s : slots) {
    const KernelEntry& entry = registry.get(s.kernel, s.kind);
    TITAN_CHECK(entry.device == DeviceKind::cuda, s.module, ": kernel ", s.kernel, " runs on ",
                device_kind_name(entry.device), ", not cuda");
    TITAN_CHECK(s.kind != OpKind::linear || s.kernel == linear, s.module, ": linear kernel ",
                s.kernel, " is not CUDA's default (", linear, "), so decode would not fuse GEMVs");
    if (const auto* a = std::get_if<AttentionKernel>(&entry.impl)) {
      const AttentionShape decode{
          1, 1, 512, args.num_attention_heads, args.num_key_value_heads, args.head_dim};
      const std::string refused = a->check(decode);
      TITAN_CHECK(refused.empty(), s.module, ": ", s.kernel, " refuses a decode step: ", refused);
      TITAN_CHECK(compute != DType::bf16 || a->forward_bf16 != nullptr, s.module, ": ", s.kernel,
                  " has no bf16 forward (a bf16 model over its bf16 KV cache)");
    }
  }
  registry.device_ops(DeviceKind::cuda).gemv(std::span<const GemvProduct>(), nullptr);
  std::printf("%s decode: every linear on %s, one-token products on CUDA's gemv\n",
              std::string(dtype_name(compute)).c_str(), linear.c_str());
}

}  // namespace

int main() {
  try {
    for (const char* model : {"tiny", "tiny_moe"}) {
      for (const DType compute : {DType::f32, DType::bf16}) check_step(model, compute);
    }
    for (const DType compute : {DType::f32, DType::bf16}) check_decode(flavor("tiny"), compute);
    const DeviceOps& ops = kernel_registry().device_ops(DeviceKind::cuda);
    TITAN_CHECK(ops.device == DeviceKind::cuda, "the cuda DeviceOps table is not CUDA's");
    // A dense LoRA step adds to those slots' linear kernels the DeviceOps LoraLinear calls: the
    // rank-wide scaling, the bf16 roundings of A, B and the products, and the dropout's mask.
    TITAN_CHECK(
        ops.scale && ops.round_to_bf16 && ops.widen_bf16 && ops.lora_dropout && ops.transpose,
        "the cuda DeviceOps lack one a LoRA step calls (scale, round_to_bf16, widen_bf16, "
        "lora_dropout, transpose)");
    std::printf(
        "LoRA step (dense): the slots' linear kernels and the DeviceOps scale, "
        "round_to_bf16, widen_bf16, lora_dropout, transpose\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "titan_cuda_step_kernels_check: %s\n", e.what());
    return 1;
  }
  std::string refusal;
  try {
    check_step("tiny_moe", DType::f32, {{"model.layers.*.mlp.experts", "experts_grouped"}});
  } catch (const Error& e) {
    refusal = e.what();
  }
  if (refusal.find("experts_grouped") == std::string::npos) {
    std::fprintf(stderr,
                 "titan_cuda_step_kernels_check: the tiny Qwen3-MoE with its experts bound to the "
                 "CPU's experts_grouped was not refused naming it (%s)\n",
                 refusal.empty() ? "no error" : refusal.c_str());
    return 1;
  }
  std::printf("tiny_moe with a CPU experts kernel refused as expected: %s\n", refusal.c_str());
  std::printf("titan_cuda_step_kernels_check: ok\n");
  return 0;
}
