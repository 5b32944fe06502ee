// Reading the reference tensors the Python scripts of tests/reference/ write (ctest fixtures,
// under $TITAN_BINARY_DIR/reference) and comparing a model's gradients with them.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "compare.h"
#include "titan/io/safetensors.h"
#include "titan/models/causal_lm.h"

namespace titan::test {

inline std::string reference_dir() {
  const char* dir = std::getenv("TITAN_BINARY_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/reference";
}

inline std::vector<int32_t> read_ids(const SafetensorsEntry& e) {
  const auto* p = static_cast<const int32_t*>(e.data);
  return {p, p + e.numel()};
}

// Every parameter's gradient against `prefix` + its HF name in the reference, 1e-4 relative
// (fp32 sums in another order through a whole backward).
inline void expect_grads_close(const CausalLM& model, const SafetensorsCheckpoint& ref,
                               const std::string& prefix) {
  for (const ParamGroup& g : model.param_groups()) {
    for (const ParamView& v : g.views()) {
      std::vector<float> want_grad(v.numel);
      read_f32(ref.at(prefix + v.spec.name), want_grad.data(), v.numel);
      testing::expect_close(prefix + v.spec.name, g.grads() + v.offset, want_grad.data(), v.numel,
                            1e-4);
    }
  }
}

}  // namespace titan::test
