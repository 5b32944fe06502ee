// Reading the reference tensors the Python scripts of tests/reference/ write (ctest fixtures,
// under $TITAN_BINARY_DIR/reference) and comparing a model's training step with them.
#pragma once

#include <gtest/gtest.h>

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

// A training forward (logits kept) and backward of `model` on the reference's input_ids and
// targets, (batch, seq): the scored-token count, the logits, the mean loss and every gradient
// against the reference's. fp32 on both sides, summed in other orders (and HF's eager softmax is
// not blockwise): agreement to accumulated rounding, ~1e-6 relative. Returns the options used, for
// further steps on the same batch.
inline ForwardOptions expect_step_matches_reference(CausalLM& model,
                                                    const SafetensorsCheckpoint& ref, int64_t batch,
                                                    int64_t seq) {
  const std::vector<int32_t> ids = read_ids(ref.at("input_ids"));
  const std::vector<int32_t> targets = read_ids(ref.at("targets"));
  int64_t n_valid = 0;
  for (const int32_t t : targets) n_valid += t != kIgnoreIndex;
  std::vector<float> logits(batch * seq * model.args().vocab_size), want(logits.size());
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / static_cast<float>(n_valid);
  options.logits = logits.data();
  const CrossEntropyResult r = model.forward(ids.data(), targets.data(), batch, seq, options);
  model.backward();
  EXPECT_EQ(r.n_scored, n_valid);
  read_f32(ref.at("logits"), want.data(), want.size());
  testing::expect_close("logits", logits.data(), want.data(), logits.size(), 1e-5);
  float want_loss = 0.0f;
  read_f32(ref.at("loss"), &want_loss, 1);
  const auto loss = static_cast<float>(r.loss_sum / r.n_scored);
  testing::expect_close("loss", &loss, &want_loss, 1, 1e-5);
  expect_grads_close(model, ref, "grad.");
  options.logits = nullptr;
  return options;
}

}  // namespace titan::test
