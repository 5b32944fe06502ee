// The lm_head loss's workspace is sized from the kernel [overrides] (or a plugin) binds to
// lm_head, not from the device's default: in the model's activation arena and in titan plan.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "error_of.h"
#include "tiny_models.h"
#include "titan/dispatch/registry.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/registry.h"
#include "titan/ops/cross_entropy.h"
#include "titan/train/job_config.h"
#include "titan/train/job_resolve.h"
#include "titan/train/training_plan.h"

namespace titan {
namespace {

// The built-in loss's workspace and 16 residual rows more: past the layers' shared scratch of a
// tiny model (whose room the loss's workspace shares), into what the arena keeps for the backward.
int64_t wide_workspace_bytes(int64_t n_tokens, int64_t hidden, int64_t vocab, int64_t chunk_tokens,
                             bool bf16) {
  return lm_head_workspace_bytes(n_tokens, hidden, vocab, chunk_tokens, bf16) +
         16 * n_tokens * hidden * static_cast<int64_t>(sizeof(float));
}

// Writes all of the workspace it claims, as a kernel may, then computes the built-in loss.
CrossEntropyResult wide_workspace_loss(const CrossEntropyArgs& a) {
  std::memset(a.workspace, 0xff,
              static_cast<size_t>(
                  wide_workspace_bytes(a.n_tokens, a.hidden, a.vocab, a.chunk_tokens, false)));
  return lm_head_cross_entropy(a);
}

const char* const kWide = "cross_entropy_wide_workspace_test";

void register_wide_workspace_loss() {
  static const bool registered = [] {
    LmHeadLossKernel loss{wide_workspace_loss, lm_head_chunk_tokens, wide_workspace_bytes};
    kernel_registry().add({kWide, OpKind::lm_head_loss, {DType::f32}, "test only", loss});
    return true;
  }();
  ASSERT_TRUE(registered);
}

// The loss and every gradient of one forward and backward of the tiny dense model under `rules`.
std::vector<float> step_of(const std::vector<OverrideRule>& rules) {
  std::unique_ptr<CausalLM> model = make_model(test::tiny_dense(false), rules);
  model->initialize(7);
  model->allocate_gradients();
  model->zero_gradients();
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> ids(batch * seq), labels(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    ids[i] = static_cast<int32_t>((i * 7 + 3) % 97);
    labels[i] = static_cast<int32_t>((i * 5 + 11) % 97);
  }
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / static_cast<float>(batch * seq);
  const CrossEntropyResult r = model->forward(ids.data(), labels.data(), batch, seq, options);
  model->backward();
  std::vector<float> out = {static_cast<float>(r.loss_sum)};
  for (const ParamGroup& g : model->param_groups()) {
    out.insert(out.end(), g.grads(), g.grads() + g.numel());
  }
  return out;
}

TEST(LossWorkspace, TheArenaHoldsTheBoundKernelsWorkspace) {
  register_wide_workspace_loss();
  const std::vector<float> builtin = step_of({});
  const std::vector<float> wide = step_of({{"lm_head", kWide}});
  ASSERT_EQ(wide.size(), builtin.size());
  // The wide kernel computes the built-in loss: what it wrote over its workspace touched nothing
  // the backward reads, so every gradient is the same to the bit.
  EXPECT_EQ(std::memcmp(wide.data(), builtin.data(), wide.size() * sizeof(float)), 0);
}

TEST(LossWorkspace, ThePlanSizesTheBoundKernelsWorkspace) {
  register_wide_workspace_loss();
  JobConfig config = job_config_preset("tiny");
  const TrainingPlan builtin = plan_training(plan_inputs(config, 1));
  config.overrides = {{"lm_head", kWide}};
  const PlanInputs in = plan_inputs(config, 1);
  const TrainingPlan wide = plan_training(in);
  const std::unique_ptr<CausalLM> model = make_model(
      resolve_job_model_args(config), {{"lm_head", kWide}}, in.compute_dtype, Residency::released);
  model->set_activation_checkpointing(in.checkpointing);
  EXPECT_EQ(wide.memory.activations, model->activation_bytes(in.local_batch_size, in.seq_len));
  EXPECT_GT(wide.memory.activations, builtin.memory.activations);
}

// Under tensor parallel the plan refuses, as the model does, a bound loss kernel without a
// vocabulary-parallel form, or without the chunk count the group's reductions follow.
TEST(LossWorkspace, ThePlanRefusesABoundKernelTensorParallelCannotRun) {
  register_wide_workspace_loss();
  static const bool registered = [] {
    LmHeadLossKernel loss = std::get<LmHeadLossKernel>(
        kernel_registry().get("cross_entropy_chunked", OpKind::lm_head_loss).impl);
    loss.chunk_tokens = nullptr;
    kernel_registry().add(
        {"cross_entropy_unchunked_test", OpKind::lm_head_loss, {DType::f32}, "test only", loss});
    return true;
  }();
  ASSERT_TRUE(registered);
  JobConfig config = job_config_preset("tiny");
  config.parallelism.tensor_parallel_degree = 2;
  config.overrides = {{"lm_head", kWide}};
  EXPECT_EQ(test::error_of([&] { plan_inputs(config, 2); }),
            std::string("model: lm_head loss kernel '") + kWide +
                "' has no vocabulary-parallel form (tensor parallel cuts the lm_head along the "
                "vocabulary)");
  config.overrides = {{"lm_head", "cross_entropy_unchunked_test"}};
  EXPECT_EQ(test::error_of([&] { plan_inputs(config, 2); }),
            "model: lm_head loss kernel 'cross_entropy_unchunked_test' has no chunk_tokens "
            "(tensor parallel's loss reduces over the group per chunk, which titan plan counts)");
}

}  // namespace
}  // namespace titan
