// Host-side, no GPU needed: every kernel a training step of the tiny Qwen3 and of the tiny
// Qwen3-MoE binds on CUDA, in fp32 and in bf16 mixed precision, has a registration for
// DeviceKind::cuda (dispatch/cuda/cuda_kernels.cpp) that takes the slot's dtype and the step's
// shapes -- the slots DecoderLM builds on CUDA (decoder_lm_default_slots), checked as a model's are
// before anything is allocated (apply_overrides with no rules, then the kernels' constraints) --
// and, under bf16, the bf16 forms the CPU's step runs at its rounding points (attention's forward
// and backward over bf16 q, k, v; SwiGLU's recompute and backward; the MoE dispatch's rounded
// gather and the grouped experts' bf16 GEMMs; the loss's bf16 GEMMs are its bf16 dtype); and CUDA
// has its DeviceOps table (the residual adds, zeroing, clipping and norms, the bf16 casts, the
// RoPE table, the load-balancing statistics, AdamW). The check is shown able to fail: the tiny
// Qwen3-MoE with its experts bound to a CPU kernel (an [overrides] rule) must be refused naming
// it. Prints each slot's kernel; exit 1 with the reason otherwise. A build without CUDA registers
// no CUDA kernel: it fails there.
#include <cstdio>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
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

}  // namespace

int main() {
  try {
    for (const char* model : {"tiny", "tiny_moe"}) {
      for (const DType compute : {DType::f32, DType::bf16}) check_step(model, compute);
    }
    TITAN_CHECK(kernel_registry().device_ops(DeviceKind::cuda).device == DeviceKind::cuda,
                "the cuda DeviceOps table is not CUDA's");
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
