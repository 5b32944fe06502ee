// Host-side, no GPU needed: every kernel a dense fp32 training step of the tiny Qwen3 binds on CUDA
// has a registration for DeviceKind::cuda (dispatch/cuda/cuda_kernels.cpp) that takes the slot's
// dtype and the step's shapes -- the slots DecoderLM builds on CUDA (decoder_lm_default_slots),
// checked as a model's are before anything is allocated (apply_overrides with no rules, then the
// kernels' constraints) -- and CUDA has its DeviceOps table (the residual adds, zeroing, clipping
// and norms, the RoPE table, AdamW). The check is shown able to fail: the tiny Qwen3-MoE's router
// has no CUDA kernel yet, and its slots must be refused naming it. Prints each slot's kernel;
// exit 1 with the reason otherwise. A build without CUDA registers no CUDA kernel: it fails there.
#include <cstdio>
#include <map>
#include <string>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/overrides.h"
#include "titan/dispatch/registry.h"
#include "titan/models/decoder_lm_slots.h"
#include "titan/models/qwen3/flavors.h"

int main() {
  using namespace titan;
  const KernelRegistry& registry = kernel_registry();
  try {
    const ModelArgs& args = flavor("tiny");
    std::vector<KernelSlot> slots = decoder_lm_default_slots(args, DType::f32, DeviceKind::cuda);
    apply_overrides(slots, {}, registry);
    // scripts/cuda-device-check.sh's step: 2 rows of 64 tokens.
    check_decoder_lm_slot_constraints(slots, args, 2, 64);
    std::map<std::string, int> bound;  // kernel -> slots
    for (const KernelSlot& s : slots) {
      const KernelEntry& entry = registry.get(s.kernel, s.kind);
      TITAN_CHECK(entry.device == DeviceKind::cuda, s.module, ": kernel ", s.kernel, " runs on ",
                  device_kind_name(entry.device), ", not cuda");
      ++bound[s.kernel];
    }
    for (const auto& [kernel, count] : bound)
      std::printf("%-24s %d slots\n", kernel.c_str(), count);
    TITAN_CHECK(registry.device_ops(DeviceKind::cuda).device == DeviceKind::cuda,
                "the cuda DeviceOps table is not CUDA's");
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
