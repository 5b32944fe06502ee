// The Qwen3 model against Hugging Face Transformers' Qwen3ForCausalLM and Qwen3MoeForCausalLM
// (fp32, eager attention and experts): logits, loss, every parameter gradient and the weights
// after one AdamW step, for the tiny configs of tests/reference/qwen3_reference.py (run by ctest
// as a fixture before this test); for MoE also the load-balancing loss and the gradients with it
// (output_router_logits), through the grouped and the reference experts kernels.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compare.h"
#include "model_reference_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/decoder_lm.h"
#include "titan/ops/adamw.h"

namespace titan {
namespace {

using test::expect_grads_close;
using test::read_ids;
using test::reference_dir;
using testing::expect_close;

ModelArgs args_from_metadata(const std::map<std::string, std::string>& meta) {
  const auto num = [&](const char* key) { return nlohmann::json::parse(meta.at(key)); };
  ModelArgs a;
  a.hidden_size = num("hidden_size");
  a.intermediate_size = num("intermediate_size");
  a.num_hidden_layers = num("num_hidden_layers");
  a.num_attention_heads = num("num_attention_heads");
  a.num_key_value_heads = num("num_key_value_heads");
  a.head_dim = num("head_dim");
  a.tie_word_embeddings = num("tie_word_embeddings");
  a.vocab_size = num("vocab_size");
  a.rms_norm_eps = num("rms_norm_eps");
  a.rope_theta = num("rope_theta");
  a.max_position_embeddings = num("max_position_embeddings");
  if (meta.count("num_experts") != 0) {
    a.architecture = "Qwen3MoeForCausalLM";
    a.num_experts = num("num_experts");
    a.num_experts_per_tok = num("num_experts_per_tok");
    a.moe_intermediate_size = num("moe_intermediate_size");
    a.norm_topk_prob = num("norm_topk_prob");
    a.decoder_sparse_step = num("decoder_sparse_step");
    a.mlp_only_layers = num("mlp_only_layers").get<std::vector<int64_t>>();
    a.router_aux_loss_coef = num("router_aux_loss_coef");
  }
  return a;
}

class Qwen3Reference : public ::testing::TestWithParam<std::string> {};
class Qwen3MoeReference : public ::testing::TestWithParam<std::string> {};

void load_reference_params(CausalLM& model, const SafetensorsCheckpoint& ref) {
  for (ParamGroup& g : model.param_groups()) {
    for (const ParamView& v : g.views()) {
      read_f32(ref.at("param." + v.spec.name), g.params() + v.offset, v.numel);
    }
  }
}

// file: qwen3_<file>.safetensors; experts_kernel: bound to every sparse layer (MoE only).
void run_reference(const std::string& file, const std::string& attn_backend,
                   const std::string& experts_kernel = "experts_grouped") {
  const std::string path = reference_dir() + "/qwen3_" + file + ".safetensors";
  const SafetensorsCheckpoint ref = SafetensorsCheckpoint::open(path);
  const auto& meta = ref.files().front().metadata();
  ModelArgs args = args_from_metadata(meta);
  args.attn_backend = attn_backend;
  const int64_t batch = std::stoll(meta.at("batch")), seq = std::stoll(meta.at("seq"));
  std::printf("%s (attention %s%s): batch %lld, seq %lld\n", file.c_str(), attn_backend.c_str(),
              args.is_moe() ? (", " + experts_kernel).c_str() : "", static_cast<long long>(batch),
              static_cast<long long>(seq));
  std::vector<OverrideRule> overrides;
  if (args.is_moe()) overrides.push_back({"model.layers.*.mlp.experts", experts_kernel});

  DecoderLM model(args, overrides);
  model.allocate_gradients();
  load_reference_params(model, ref);
  const ForwardOptions options = test::expect_step_matches_reference(model, ref, batch, seq);
  EXPECT_EQ(model.aux_loss(), 0.0);  // output_router_logits is off by default, as in HF

  if (args.is_moe()) {
    // With output_router_logits, under activation checkpointing (recomputed routing).
    ModelArgs with_aux = args;
    with_aux.output_router_logits = true;
    DecoderLM aux_model(with_aux, overrides);
    aux_model.allocate_gradients();
    aux_model.set_activation_checkpointing(ActivationCheckpointing::full());
    load_reference_params(aux_model, ref);
    const std::vector<int32_t> ids = read_ids(ref.at("input_ids"));
    const std::vector<int32_t> labels = read_ids(ref.at("targets"));
    const CrossEntropyResult r = aux_model.forward(ids.data(), labels.data(), batch, seq, options);
    aux_model.backward();
    const float aux = static_cast<float>(aux_model.aux_loss());
    const float total = static_cast<float>(r.loss_sum / r.n_scored +
                                           args.router_aux_loss_coef * aux_model.aux_loss());
    float want_aux = 0.0f, want_total = 0.0f;
    read_f32(ref.at("aux_loss"), &want_aux, 1);
    read_f32(ref.at("loss_aux"), &want_total, 1);
    expect_close("aux_loss", &aux, &want_aux, 1, 1e-5);
    expect_close("loss with aux", &total, &want_total, 1, 1e-5);
    expect_grads_close(aux_model, ref, "grad_aux.");
  }

  const nlohmann::json adamw = nlohmann::json::parse(meta.at("adamw"));
  AdamWConfig config;
  config.lr = adamw["lr"];
  config.beta1 = adamw["betas"][0];
  config.beta2 = adamw["betas"][1];
  config.eps = adamw["eps"];
  config.weight_decay = adamw["weight_decay"];
  const AdamWScalars scalars = adamw_scalars(config, config.lr, 1);
  for (ParamGroup& g : model.param_groups()) {
    // The step starts from the reference's own gradients: Adam's first step is lr * g / (|g| +
    // eps') per element, which turns a 1e-7 rounding difference in a near-zero gradient into an
    // O(lr) difference in the weight. With equal gradients the optimizer itself must agree to
    // rounding.
    for (const ParamView& v : g.views()) {
      read_f32(ref.at("grad." + v.spec.name), g.grads() + v.offset, v.numel);
    }
    g.allocate_optimizer_state();
    adamw_update(g.params(), g.grads(), g.exp_avg(), g.exp_avg_sq(), g.numel(), scalars);
    for (const ParamView& v : g.views()) {
      std::vector<float> want_param(v.numel);
      read_f32(ref.at("updated." + v.spec.name), want_param.data(), v.numel);
      expect_close("updated." + v.spec.name, g.params() + v.offset, want_param.data(), v.numel,
                   1e-6);
    }
  }
}

// torchtitan's rows: inputs w[:-1] and labels w[1:] of a window of seq + 1 tokens (what the
// DataLoader hands the trainer, tests/unit/test_loader.cpp), against PyTorch's cross_entropy over
// every position of the same window.
TEST(Qwen3Window, TrainingStepOnTorchtitanRowsMatchesPyTorch) {
  const SafetensorsCheckpoint ref =
      SafetensorsCheckpoint::open(reference_dir() + "/qwen3_window.safetensors");
  const auto& meta = ref.files().front().metadata();
  const ModelArgs args = args_from_metadata(meta);
  const int64_t batch = std::stoll(meta.at("batch")), seq = std::stoll(meta.at("seq"));
  const std::vector<int32_t> window = read_ids(ref.at("window"));
  ASSERT_EQ(static_cast<int64_t>(window.size()), batch * (seq + 1));
  std::vector<int32_t> inputs, labels;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* w = window.data() + b * (seq + 1);
    inputs.insert(inputs.end(), w, w + seq);
    labels.insert(labels.end(), w + 1, w + seq + 1);
  }
  DecoderLM model(args);
  model.allocate_gradients();
  load_reference_params(model, ref);
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / static_cast<float>(batch * seq);
  const CrossEntropyResult r = model.forward(inputs.data(), labels.data(), batch, seq, options);
  model.backward();
  EXPECT_EQ(r.n_scored, batch * seq);  // every position has a target
  float want_loss = 0.0f;
  read_f32(ref.at("loss"), &want_loss, 1);
  const float loss = static_cast<float>(r.loss_sum / r.n_scored);
  expect_close("loss", &loss, &want_loss, 1, 1e-5);
  expect_grads_close(model, ref, "grad.");
}

TEST_P(Qwen3Reference, BlockwiseAttentionMatchesTransformers) {
  run_reference(GetParam(), "blockwise");
}
TEST_P(Qwen3Reference, ReferenceAttentionMatchesTransformers) {
  run_reference(GetParam(), "reference");
}

TEST_P(Qwen3MoeReference, GroupedExpertsMatchTransformers) {
  run_reference("moe_" + GetParam(), "blockwise", "experts_grouped");
}
TEST_P(Qwen3MoeReference, ReferenceExpertsMatchTransformers) {
  run_reference("moe_" + GetParam(), "reference", "experts_reference");
}

INSTANTIATE_TEST_SUITE_P(Configs, Qwen3MoeReference,
                         ::testing::Values("all_sparse", "mixed", "step2"));
INSTANTIATE_TEST_SUITE_P(Configs, Qwen3Reference,
                         ::testing::Values("tied_gqa2", "untied_mha", "gqa4_long",
                                           "tied_gqa4_odd"));

}  // namespace
}  // namespace titan
