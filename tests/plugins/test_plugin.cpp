// Kernel plugins for test_verify_kernels, one source built four ways (tests/CMakeLists.txt):
//   TITAN_TEST_PLUGIN_GOOD       two kernels: a SwiGLU of its own (std::exp) and an RMSNorm that
//                                calls titan's reference, so it needs the symbols titan exports
//   TITAN_TEST_PLUGIN_NO_SYMBOLS a shared library that is no titan plugin
//   TITAN_TEST_PLUGIN_OTHER_ABI  a plugin built against another kernel interface
//   TITAN_TEST_PLUGIN_DUPLICATE  a plugin registering a name titan already has
// and plugins that add a good kernel ("good_before_<case>") and then a bad one, or throw: each is
// refused and registers neither:
//   TITAN_TEST_PLUGIN_NULL_FORWARD   a swiglu kernel whose forward is null
//   TITAN_TEST_PLUGIN_NULL_BACKWARD  an rms_norm kernel whose backward is null
//   TITAN_TEST_PLUGIN_NULL_LOSS      an lm_head_loss kernel whose forward_backward is null
//   TITAN_TEST_PLUGIN_BF16_NULL      a linear kernel declaring bf16 with a null backward_bf16
//   TITAN_TEST_PLUGIN_EMPTY_NAME     a kernel named ""
//   TITAN_TEST_PLUGIN_BAD_NAME       a kernel named "my kernel"
//   TITAN_TEST_PLUGIN_WRONG_KIND     declared rms_norm, implemented as a SwigluKernel
//   TITAN_TEST_PLUGIN_SAME_TWICE     the same new name twice in one plugin
//   TITAN_TEST_PLUGIN_THROWS         a registration that throws std::runtime_error
// and TITAN_TEST_PLUGIN_TABLE, whose registration adds the table test_plugin_fuzz exports.
#include <cmath>
#include <cstdint>

#include <stdexcept>

#include "titan/dispatch/plugin.h"
#include "titan/ops/linear.h"
#include "titan/ops/rms_norm.h"

#if !defined(TITAN_TEST_PLUGIN_NO_SYMBOLS) && !defined(TITAN_TEST_PLUGIN_OTHER_ABI) && \
    !defined(TITAN_TEST_PLUGIN_TABLE)
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
#elif defined(TITAN_TEST_PLUGIN_TABLE)
// test_plugin_fuzz's: the registration table comes from the test binary, which exports it.
extern "C" void titan_test_plugin_table(titan::KernelPluginRegistrar& registrar);
TITAN_KERNEL_PLUGIN(registrar) {
  titan_test_plugin_table(registrar);
}
#else
// The bad cases: a good kernel first, then the one at fault.
#if defined(TITAN_TEST_PLUGIN_NULL_FORWARD)
#define TITAN_TEST_CASE "null_forward"
#elif defined(TITAN_TEST_PLUGIN_NULL_BACKWARD)
#define TITAN_TEST_CASE "null_backward"
#elif defined(TITAN_TEST_PLUGIN_NULL_LOSS)
#define TITAN_TEST_CASE "null_loss"
#elif defined(TITAN_TEST_PLUGIN_BF16_NULL)
#define TITAN_TEST_CASE "bf16_null"
#elif defined(TITAN_TEST_PLUGIN_EMPTY_NAME)
#define TITAN_TEST_CASE "empty_name"
#elif defined(TITAN_TEST_PLUGIN_BAD_NAME)
#define TITAN_TEST_CASE "bad_name"
#elif defined(TITAN_TEST_PLUGIN_WRONG_KIND)
#define TITAN_TEST_CASE "wrong_kind"
#elif defined(TITAN_TEST_PLUGIN_SAME_TWICE)
#define TITAN_TEST_CASE "same_twice"
#elif defined(TITAN_TEST_PLUGIN_THROWS)
#define TITAN_TEST_CASE "throws"
#endif
TITAN_KERNEL_PLUGIN(registrar) {
  const titan::SwigluKernel swiglu{swiglu_plain_forward, swiglu_plain_backward};
  registrar.add({"good_before_" TITAN_TEST_CASE,
                 titan::OpKind::swiglu,
                 {titan::DType::f32},
                 "test plugin: a good kernel before the bad one",
                 swiglu});
#if defined(TITAN_TEST_PLUGIN_NULL_FORWARD)
  registrar.add({"null_forward",
                 titan::OpKind::swiglu,
                 {titan::DType::f32},
                 "",
                 titan::SwigluKernel{nullptr, swiglu_plain_backward}});
#elif defined(TITAN_TEST_PLUGIN_NULL_BACKWARD)
  registrar.add({"null_backward",
                 titan::OpKind::rms_norm,
                 {titan::DType::f32},
                 "",
                 titan::RmsNormKernel{titan::rms_norm_forward_reference, nullptr}});
#elif defined(TITAN_TEST_PLUGIN_NULL_LOSS)
  registrar.add({"null_loss",
                 titan::OpKind::lm_head_loss,
                 {titan::DType::f32},
                 "",
                 titan::LmHeadLossKernel{nullptr}});
#elif defined(TITAN_TEST_PLUGIN_BF16_NULL)
  registrar.add(
      {"bf16_null",
       titan::OpKind::linear,
       {titan::DType::f32, titan::DType::bf16},
       "",
       titan::LinearKernel{titan::linear_forward_reference, titan::linear_backward_reference,
                           titan::linear_forward_bf16_reference, nullptr}});
#elif defined(TITAN_TEST_PLUGIN_EMPTY_NAME)
  registrar.add({"", titan::OpKind::swiglu, {titan::DType::f32}, "nameless", swiglu});
#elif defined(TITAN_TEST_PLUGIN_BAD_NAME)
  registrar.add({"my kernel", titan::OpKind::swiglu, {titan::DType::f32}, "", swiglu});
#elif defined(TITAN_TEST_PLUGIN_WRONG_KIND)
  registrar.add({"wrong_kind", titan::OpKind::rms_norm, {titan::DType::f32}, "", swiglu});
#elif defined(TITAN_TEST_PLUGIN_SAME_TWICE)
  registrar.add(
      {"good_before_" TITAN_TEST_CASE, titan::OpKind::swiglu, {titan::DType::f32}, "", swiglu});
#elif defined(TITAN_TEST_PLUGIN_THROWS)
  throw std::runtime_error("out of coffee");
#endif
}
#endif
