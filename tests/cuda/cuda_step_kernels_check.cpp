// Host-side, no GPU needed: every kernel a dense training step of the tiny Qwen3 binds on CUDA, in
// fp32 and in bf16 mixed precision, has a registration for DeviceKind::cuda
// (dispatch/cuda/cuda_kernels.cpp) that takes the slot's dtype and the step's shapes -- the slots
// DecoderLM builds on CUDA (decoder_lm_default_slots), checked as a model's are before anything is
// allocated (apply_overrides with no rules, then the kernels' constraints) -- and, under bf16, the
// bf16 forms the CPU's step runs at its rounding points (attention's forward and backward over
// bf16 q, k, v; SwiGLU's recompute and backward; the loss's bf16 GEMMs are its bf16 dtype); and
// CUDA has its DeviceOps table (the residual adds, zeroing, clipping and norms, the bf16 casts,
// the RoPE table, AdamW, and what a dense LoRA step adds: LoRA's dropout and B's transpose). The
// check is shown able to fail: the tiny Qwen3-MoE's router has no CUDA kernel yet, and its slots
// must be refused naming it. Prints each slot's kernel; exit 1 with the reason otherwise. A build
// without CUDA registers no CUDA kernel: it fails there.
#include <cstdio>
#include <map>
#include <string>
#include <variant>

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
}

void check_step(const ModelArgs& args, DType compute) {
  const KernelRegistry& registry = kernel_registry();
  std::vector<KernelSlot> slots = decoder_lm_default_slots(args, compute, DeviceKind::cuda);
  apply_overrides(slots, {}, registry);
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
  std::printf("%s step:\n", std::string(dtype_name(compute)).c_str());
  for (const auto& [kernel, count] : bound)
    std::printf("  %-24s %d slots\n", kernel.c_str(), count);
}

}  // namespace

int main() {
  try {
    for (const DType compute : {DType::f32, DType::bf16}) check_step(flavor("tiny"), compute);
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
  std::string moe;
  try {
    decoder_lm_default_slots(flavor("tiny_moe"), DType::f32, DeviceKind::cuda);
  } catch (const Error& e) {
    moe = e.what();
  }
  if (moe.empty()) {
    std::fprintf(stderr,
                 "titan_cuda_step_kernels_check: the tiny Qwen3-MoE found CUDA kernels for every "
                 "slot; this check expected its router to have none (update it)\n");
    return 1;
  }
  std::printf("tiny_moe refused as expected: %s\n", moe.c_str());
  std::printf("titan_cuda_step_kernels_check: ok\n");
  return 0;
}
