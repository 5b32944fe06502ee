// Kernel plugins: kernels built outside titan, in a shared library titan loads at start-up
// (`experimental.custom_import` in a training config, `--plugin` for `titan verify-kernels`), as
// torchtitan's custom_import brings a user's module in before the model is built. A plugin is
// C++ compiled against titan's headers (src/), with the same compiler and standard library, and
// may call anything titan's binary exports (its ops, the backend's GEMMs and vector primitives).
// It defines its registration with TITAN_KERNEL_PLUGIN:
//
//   #include "titan/dispatch/plugin.h"
//   TITAN_KERNEL_PLUGIN(registrar) {
//     registrar.add({"my_rms_norm", titan::OpKind::rms_norm, {titan::DType::f32}, "what it is",
//                    titan::RmsNormKernel{my_forward, my_backward}});
//   }
//
// Its kernels then join the registry under their names: `titan verify-kernels --plugin LIB
// --kernel my_rms_norm` checks them against the op's reference, and `[overrides]` binds them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/dispatch/registry.h"

namespace titan {

// What a plugin and the titan loading it must agree on: the layout of every struct they pass
// (a changed field changes a size), and a version bumped when a kernel's contract changes without
// changing one.
// 2: the experts in stages; 3: a linear, RMSNorm or lm_head loss kernel may be handed a null
// weight gradient (a frozen weight: LoRA), and must then compute none (a linear's x may then be
// null); 4: the embedding's and the lm_head loss's vocabulary-parallel forms (VocabShard).
constexpr uint64_t kKernelPluginVersion = 4;
constexpr uint64_t kernel_plugin_abi() {
  const uint64_t sizes[] = {sizeof(KernelEntry),
                            sizeof(EmbeddingKernel),
                            sizeof(RmsNormKernel),
                            sizeof(LinearKernel),
                            sizeof(RopeKernel),
                            sizeof(AttentionKernel),
                            sizeof(SwigluKernel),
                            sizeof(LmHeadLossKernel),
                            sizeof(ExpertsKernel),
                            sizeof(AttentionShape),
                            sizeof(CrossEntropyArgs),
                            sizeof(CrossEntropyResult),
                            sizeof(ExpertsShape),
                            sizeof(ExpertsActivations),
                            sizeof(ExpertsScratch),
                            sizeof(ExpertWeights),
                            sizeof(ExpertWeightsBf16),
                            sizeof(ExpertGrads),
                            sizeof(RopeCache),
                            sizeof(std::string),
                            sizeof(std::vector<DType>),
                            sizeof(std::function<std::string()>),
                            sizeof(RouterKernel),
                            sizeof(MoeDispatchKernel),
                            sizeof(GroupedExpertsKernel),
                            sizeof(MoeCombineKernel),
                            sizeof(VocabShard)};
  uint64_t h = 1469598103934665603ull ^ kKernelPluginVersion;  // FNV-1a over the sizes
  for (const uint64_t s : sizes) h = (h ^ s) * 1099511628211ull;
  return h;
}

// Handed to a plugin's registration: add() registers one kernel (one KernelRegistry::validate
// refuses is an error naming the plugin and the kernel).
class KernelPluginRegistrar {
 public:
  virtual ~KernelPluginRegistrar() = default;
  virtual void add(KernelEntry entry) = 0;
};

// Loads the plugin at `path` and registers its kernels in kernel_registry(); returns their
// names. Loading the same file again registers nothing new and returns the same names. Every
// failure -- no such file, not a shared library, not a titan plugin, built against another titan,
// a kernel it cannot register (KernelRegistry::validate: an empty or non-identifier name, a name
// taken, a declared kind its implementation is not, a null forward or backward, a bf16 form its
// dtypes need missing), a registration that throws, none registered -- is a titan::Error naming
// the file (and the kernel, where one is at fault). A refused plugin registers none of its
// kernels: they join the registry only once its whole registration has passed.
std::vector<std::string> load_kernel_plugin(const std::string& path);

}  // namespace titan

#define TITAN_KERNEL_PLUGIN(registrar)            \
  extern "C" uint64_t titan_kernel_plugin_abi() { \
    return ::titan::kernel_plugin_abi();          \
  }                                               \
  extern "C" void titan_register_kernels(::titan::KernelPluginRegistrar& registrar)
