// Kernel plugins for test_verify_kernels, one source built four ways (tests/CMakeLists.txt):
//   TITAN_TEST_PLUGIN_GOOD       two kernels: a SwiGLU of its own (std::exp) and an RMSNorm that
//                                calls titan's reference, so it needs the symbols titan exports
//   TITAN_TEST_PLUGIN_NO_SYMBOLS a shared library that is no titan plugin
//   TITAN_TEST_PLUGIN_OTHER_ABI  a plugin built against another kernel interface
//   TITAN_TEST_PLUGIN_DUPLICATE  a plugin registering a name titan already has
#include <cmath>
#include <cstdint>

#include "titan/dispatch/plugin.h"
#include "titan/ops/rms_norm.h"

#if defined(TITAN_TEST_PLUGIN_GOOD) || defined(TITAN_TEST_PLUGIN_DUPLICATE)
namespace {

float silu(float z) {
  return z / (1.0f + std::exp(-z));
}

void swiglu_plain_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void swiglu_plain_backward(float* dgate, float* dup, const float* dout, const float* gate,
                           const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-gate[i]));
    dup[i] = dout[i] * gate[i] * s;
    dgate[i] = dout[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
  }
}

}  // namespace
#endif

#if defined(TITAN_TEST_PLUGIN_GOOD)
TITAN_KERNEL_PLUGIN(registrar) {
  registrar.add({"swiglu_plain",
                 titan::OpKind::swiglu,
                 {titan::DType::f32},
                 "test plugin: silu(gate) * up with std::exp",
                 titan::SwigluKernel{swiglu_plain_forward, swiglu_plain_backward}});
  registrar.add({"rms_norm_from_plugin",
                 titan::OpKind::rms_norm,
                 {titan::DType::f32},
                 "test plugin: titan's reference, called from the plugin",
                 titan::RmsNormKernel{titan::rms_norm_forward_reference,
                                      titan::rms_norm_backward_reference}});
}
#elif defined(TITAN_TEST_PLUGIN_NO_SYMBOLS)
extern "C" int not_a_titan_plugin() {
  return 0;
}
#elif defined(TITAN_TEST_PLUGIN_OTHER_ABI)
extern "C" uint64_t titan_kernel_plugin_abi() {
  return titan::kernel_plugin_abi() + 1;
}
extern "C" void titan_register_kernels(titan::KernelPluginRegistrar&) {}
#elif defined(TITAN_TEST_PLUGIN_DUPLICATE)
TITAN_KERNEL_PLUGIN(registrar) {
  registrar.add({"swiglu",
                 titan::OpKind::swiglu,
                 {titan::DType::f32},
                 "test plugin: a name titan already has",
                 titan::SwigluKernel{swiglu_plain_forward, swiglu_plain_backward}});
}
#endif
