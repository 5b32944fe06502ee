// The override map: glob matching, rebinding, and the errors and warnings design.md asks for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "titan/core/error.h"
#include "titan/dispatch/overrides.h"
#include "titan/models/decoder_lm.h"

#include "error_of.h"
#include "test_safetensors_util.h"
#include "tiny_models.h"

namespace titan {
namespace {

ModelArgs tiny_args() {
  ModelArgs a;
  a.vocab_size = 64;
  a.hidden_size = 16;
  a.intermediate_size = 24;
  a.num_hidden_layers = 2;
  a.num_attention_heads = 2;
  a.num_key_value_heads = 1;
  a.head_dim = 8;
  return a;
}

TEST(Glob, StarCrossesDots) {
  EXPECT_TRUE(glob_match("model.layers.*.mlp", "model.layers.3.mlp"));
  EXPECT_TRUE(glob_match("*.mlp", "model.layers.12.mlp"));
  EXPECT_TRUE(glob_match("model.layers.?.self_attn", "model.layers.7.self_attn"));
  EXPECT_FALSE(glob_match("model.layers.?.self_attn", "model.layers.17.self_attn"));
  EXPECT_FALSE(glob_match("model.layers.*.mlp", "model.layers.3.mlp.gate_proj"));
  EXPECT_TRUE(glob_match("*", ""));
}

TEST(Overrides, RebindAndReport) {
  DecoderLM model(tiny_args(), {{"model.layers.1.self_attn", "attention_reference"},
                                {"*.mlp", "swiglu_reference"}});
  const OverrideReport& r = model.override_report();
  ASSERT_EQ(r.applied.size(), 3u);
  EXPECT_NE(std::find(r.applied.begin(), r.applied.end(),
                      "model.layers.1.self_attn: attention_blockwise -> attention_reference"),
            r.applied.end());
  EXPECT_TRUE(r.warnings.empty());
  int reference_attention = 0;
  for (const KernelSlot& s : model.kernel_slots()) {
    reference_attention += s.kernel == "attention_reference";
  }
  EXPECT_EQ(reference_attention, 1);
}

TEST(Overrides, UnmatchedIsAWarning) {
  std::vector<KernelSlot> slots = {{"model.norm", OpKind::rms_norm, "rms_norm"}};
  const OverrideReport r =
      apply_overrides(slots, {{"model.layers.*.mlp", "swiglu_reference"}}, kernel_registry());
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("matches no module"), std::string::npos);
}

// What apply_overrides says of `rules` over a copy of `slots`: its error, or "no error".
std::string override_error(std::vector<KernelSlot> slots, const std::vector<OverrideRule>& rules) {
  try {
    apply_overrides(slots, rules, kernel_registry());
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Overrides, Errors) {
  std::vector<KernelSlot> slots = {
      {"model.layers.0.mlp", OpKind::swiglu, "swiglu"},
      {"model.layers.0.mlp.gate_proj", OpKind::linear, "linear"},
  };
  const auto message = [&](const std::vector<OverrideRule>& rules) {
    return override_error(slots, rules);
  };
  EXPECT_NE(message({{"*.mlp", "no_such_kernel"}}).find("no kernel of that name"),
            std::string::npos);
  EXPECT_NE(
      message({{"*.mlp", "swiglu_reference"}, {"model.layers.0.mlp", "swiglu"}}).find("both claim"),
      std::string::npos);
  EXPECT_NE(message({{"*.mlp", "swiglu_reference"}, {"*.gate_proj", "linear_reference"}})
                .find("an ancestor of"),
            std::string::npos);
}

ModelArgs tiny_moe_args() {
  return test::with_moe(tiny_args(), 3, 2, 8, {0});
}

TEST(Overrides, MoeExpertsRebindAndWrongKindsAreErrors) {
  DecoderLM model(tiny_moe_args(), {{"model.layers.*.mlp.experts", "experts_reference"},
                                    {"*.mlp", "swiglu_reference"}});
  const OverrideReport& r = model.override_report();
  EXPECT_EQ(r.applied, (std::vector<std::string>{
                           "model.layers.0.mlp: swiglu -> swiglu_reference",
                           "model.layers.1.mlp.experts: experts_staged -> experts_reference"}));
  EXPECT_TRUE(r.warnings.empty());
  const auto message = [](std::vector<OverrideRule> rules) {
    try {
      DecoderLM m(tiny_moe_args(), rules);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"model.layers.*.mlp.experts", "swiglu"}}),
            "override 'model.layers.*.mlp.experts' = 'swiglu': 'swiglu' is a swiglu kernel but "
            "model.layers.1.mlp.experts has no swiglu slot (its slots: experts, moe_dispatch, "
            "grouped_experts, moe_combine)");
  EXPECT_NE(message({{"model.layers.1.mlp.gate", "experts_grouped"}}).find("has no experts slot"),
            std::string::npos);
  ModelArgs too_many = tiny_moe_args();
  too_many.num_experts_per_tok = 4;
  try {
    DecoderLM m(too_many);
    FAIL() << "num_experts_per_tok > num_experts must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "model: num_experts_per_tok (4) exceeds num_experts (3)");
  }
}

// The experts' stage slots (ops/moe_stages.h) rebind one by one, and each reference stage, the
// fused kernels and the default stages give one loss: the model runs what its slots name.
TEST(Overrides, MoeStagesRebindOneByOne) {
  const std::vector<OverrideRule> stages = {
      {"model.layers.*.mlp.gate", "router_topk_reference"},
      {"model.layers.*.mlp.experts", "moe_dispatch_reference"},
      {"model.layers.*.mlp.experts", "grouped_experts_reference"},
      {"model.layers.*.mlp.experts", "moe_combine_reference"}};
  DecoderLM staged(tiny_moe_args(), stages);
  EXPECT_EQ(staged.override_report().applied,
            (std::vector<std::string>{
                "model.layers.1.mlp.gate: router_topk -> router_topk_reference",
                "model.layers.1.mlp.experts: moe_dispatch -> moe_dispatch_reference",
                "model.layers.1.mlp.experts: grouped_experts -> grouped_experts_reference",
                "model.layers.1.mlp.experts: moe_combine -> moe_combine_reference"}));
  const std::vector<int32_t> ids = {1, 5, 9, 2, 7, 3, 8, 4, 6, 0, 11, 13};
  const auto loss_of = [&](const std::vector<OverrideRule>& rules) {
    DecoderLM m(tiny_moe_args(), rules);
    m.initialize(7);
    return m.forward(ids.data(), ids.data(), 2, 6, {}).loss_sum;
  };
  const double by_default = loss_of({}), by_references = loss_of(stages),
               fused = loss_of({{"*.experts", "experts_grouped"}});
  EXPECT_EQ(by_default, fused);  // the stages equal the fused kernel bit for bit
  EXPECT_NEAR(by_references, by_default, 1e-5 * std::abs(by_default));
  EXPECT_NE(by_references, 0.0);
}

TEST(Overrides, EveryKernelDeclaresItsDtypes) {
  for (const KernelEntry* e : kernel_registry().entries()) {
    EXPECT_FALSE(e->dtypes.empty()) << e->name;
  }
  // The built-in linears compute in fp32 and, for mixed precision, with bf16 operands.
  const std::vector<DType> both = {DType::f32, DType::bf16};
  EXPECT_EQ(kernel_registry().get("linear", OpKind::linear).dtypes, both);
  EXPECT_EQ(kernel_registry().get("linear_reference", OpKind::linear).dtypes, both);
  // So do the built-in experts.
  EXPECT_EQ(kernel_registry().get("experts_grouped", OpKind::experts).dtypes, both);
  EXPECT_EQ(kernel_registry().get("experts_reference", OpKind::experts).dtypes, both);
  // A linear or experts kernel that declares bf16 must bring the bf16 functions, and one that has
  // them must declare bf16.
  const LinearKernel& builtin =
      std::get<LinearKernel>(kernel_registry().get("linear", OpKind::linear).impl);
  KernelRegistry registry;
  test::expect_error(
      [&] {
        registry.add({"claims_bf16",
                      OpKind::linear,
                      {DType::f32, DType::bf16},
                      "test only",
                      LinearKernel{builtin.forward, builtin.backward}});
      },
      {"kernel 'claims_bf16'", "declares bf16 needs forward_bf16 and backward_bf16"});
  test::expect_error(
      [&] {
        registry.add({"hides_bf16", OpKind::linear, {DType::f32}, "test only", builtin});
      },
      {"kernel 'hides_bf16'", "does not declare bf16 has forward_bf16"});
  // The bf16-output forward is an addition to the bf16 pair, not a substitute for it.
  LinearKernel rounding_only{builtin.forward, builtin.backward};
  rounding_only.forward_bf16_to_bf16 = builtin.forward_bf16_to_bf16;
  test::expect_error(
      [&] {
        registry.add({"rounding_only", OpKind::linear, {DType::f32}, "test only", rounding_only});
      },
      {"kernel 'rounding_only': a linear kernel with forward_bf16_to_bf16 needs forward_bf16 and "
       "backward_bf16"});
  const ExpertsKernel& grouped =
      std::get<ExpertsKernel>(kernel_registry().get("experts_grouped", OpKind::experts).impl);
  test::expect_error(
      [&] {
        registry.add({"experts_claims_bf16",
                      OpKind::experts,
                      {DType::f32, DType::bf16},
                      "test only",
                      ExpertsKernel{grouped.forward, grouped.backward, grouped.check}});
      },
      {"kernel 'experts_claims_bf16': an experts kernel that declares bf16 needs forward_bf16 and "
       "backward_bf16"});
  test::expect_error(
      [&] {
        registry.add({"experts_hides_bf16", OpKind::experts, {DType::f32}, "test only", grouped});
      },
      {"kernel 'experts_hides_bf16'", "does not declare bf16 has forward_bf16"});
  // A swiglu kernel brings its bf16 forms together or neither.
  SwigluKernel partial =
      std::get<SwigluKernel>(kernel_registry().get("swiglu", OpKind::swiglu).impl);
  partial.recompute_bf16 = nullptr;
  test::expect_error(
      [&] {
        registry.add({"swiglu_partial", OpKind::swiglu, {DType::f32}, "test only", partial});
      },
      {"kernel 'swiglu_partial': a swiglu kernel has recompute_bf16 and backward_bf16 together or "
       "neither"});
  // So do an embedding and an lm_head loss kernel their vocabulary-parallel forms.
  EmbeddingKernel embedding =
      std::get<EmbeddingKernel>(kernel_registry().get("embedding", OpKind::embedding).impl);
  embedding.backward_vocab_parallel = nullptr;
  test::expect_error(
      [&] {
        registry.add(
            {"embedding_partial", OpKind::embedding, {DType::f32}, "test only", embedding});
      },
      {"kernel 'embedding_partial': an embedding kernel has forward_vocab_parallel and "
       "backward_vocab_parallel together or neither"});
  LmHeadLossKernel loss = std::get<LmHeadLossKernel>(
      kernel_registry().get("cross_entropy_chunked", OpKind::lm_head_loss).impl);
  loss.vocab_parallel_workspace_bytes = nullptr;
  test::expect_error(
      [&] {
        registry.add({"loss_partial", OpKind::lm_head_loss, {DType::f32}, "test only", loss});
      },
      {"kernel 'loss_partial': an lm_head loss kernel has forward_backward_vocab_parallel and "
       "vocab_parallel_workspace_bytes together or neither"});
}

TEST(Overrides, SlotDtypeTheKernelDoesNotTakeIsRefused) {
  // A bf16 linear slot (mixed precision): an fp32-only kernel is refused for it, the built-in
  // ones are accepted; the check runs whether or not a rule rebinds the slot.
  static const bool registered = [] {
    const LinearKernel& builtin =
        std::get<LinearKernel>(kernel_registry().get("linear", OpKind::linear).impl);
    kernel_registry().add({"linear_test_f32_only",
                           OpKind::linear,
                           {DType::f32},
                           "test only",
                           LinearKernel{builtin.forward, builtin.backward}});
    return true;
  }();
  ASSERT_TRUE(registered);
  std::vector<KernelSlot> slots = {
      {"model.layers.0.mlp.gate_proj", OpKind::linear, "linear_test_f32_only", DType::bf16},
      {"model.norm", OpKind::rms_norm, "rms_norm"},
  };
  const auto message = [&](const std::vector<OverrideRule>& rules) {
    return override_error(slots, rules);
  };
  EXPECT_EQ(message({}),
            "model.layers.0.mlp.gate_proj: linear kernel 'linear_test_f32_only' takes F32, the "
            "module needs BF16");
  slots[0].kernel = "linear";
  EXPECT_EQ(message({{"*.gate_proj", "linear_test_f32_only"}}),
            "model.layers.0.mlp.gate_proj: linear kernel 'linear_test_f32_only' takes F32, the "
            "module needs BF16");
  EXPECT_EQ(message({}), "no error");
  EXPECT_EQ(message({{"*.gate_proj", "linear_reference"}}), "no error");
  // Every slot of an fp32 model is fp32, and every kernel takes fp32.
  EXPECT_NO_THROW(DecoderLM(tiny_args(), {}));
}

// A linear entry that says it runs on CUDA (its functions are the CPU's: nothing calls them).
void register_linear_on_cuda() {
  static const bool registered = [] {
    const LinearKernel& builtin =
        std::get<LinearKernel>(kernel_registry().get("linear", OpKind::linear).impl);
    KernelEntry entry{"linear_test_on_cuda",
                      OpKind::linear,
                      {DType::f32},
                      "test only",
                      LinearKernel{builtin.forward, builtin.backward}};
    entry.device = DeviceKind::cuda;
    kernel_registry().add(std::move(entry));
    return true;
  }();
  ASSERT_TRUE(registered);
}

TEST(Overrides, KernelOnAnotherDeviceIsRefused) {
  // A kernel registered for CUDA cannot serve a module whose tensors are on the CPU, whether a
  // rule binds it or it was the slot's kernel; a CPU model's default slots all pass.
  register_linear_on_cuda();
  std::vector<KernelSlot> slots = {{"model.layers.0.mlp.up_proj", OpKind::linear, "linear"}};
  EXPECT_EQ(override_error(slots, {{"*.up_proj", "linear_test_on_cuda"}}),
            "model.layers.0.mlp.up_proj: linear kernel 'linear_test_on_cuda' runs on cuda, the "
            "model on cpu");
  EXPECT_EQ(override_error(slots, {}), "no error");
  const DecoderLM model(tiny_args(), {});
  for (const KernelSlot& slot : model.kernel_slots()) {
    EXPECT_EQ(slot.device, DeviceKind::cpu) << slot.module;
  }
}

TEST(Registry, DefaultKernelPerKindAndDevice) {
  const KernelRegistry& r = kernel_registry();
  for (OpKind kind :
       {OpKind::embedding, OpKind::rms_norm, OpKind::linear, OpKind::rope, OpKind::attention,
        OpKind::swiglu, OpKind::lm_head_loss, OpKind::experts, OpKind::router, OpKind::moe_dispatch,
        OpKind::grouped_experts, OpKind::moe_combine}) {
    const KernelEntry& entry = r.get(r.default_kernel(kind, DeviceKind::cpu), kind);
    EXPECT_EQ(entry.device, DeviceKind::cpu) << op_kind_name(kind);
  }
  EXPECT_EQ(r.default_kernel(OpKind::linear, DeviceKind::cpu), "linear");
  // The experts run in stages (ops/moe_stages.h), each stage's default its built-in kernel.
  EXPECT_EQ(r.default_kernel(OpKind::experts, DeviceKind::cpu), "experts_staged");
  EXPECT_EQ(r.default_kernel(OpKind::grouped_experts, DeviceKind::cpu), "grouped_experts");
  // A registry without a device's kernels (an empty one here: the CUDA build registers CUDA's in
  // the global one) names what a model's slots would find missing.
  KernelRegistry fresh;
  EXPECT_EQ(test::error_of([&] { fresh.default_kernel(OpKind::rms_norm, DeviceKind::cuda); }),
            "no rms_norm kernel is registered for cuda");
  EXPECT_EQ(test::error_of([&] { fresh.device_ops(DeviceKind::cuda); }),
            "no ops are registered for cuda (this titan has no kernels for that device yet)");
  EXPECT_EQ(r.device_ops(DeviceKind::cpu).device, DeviceKind::cpu);
  // A default must name a kernel of that kind on that device.
  register_linear_on_cuda();
  EXPECT_EQ(test::error_of([&] { fresh.set_default(OpKind::linear, DeviceKind::cpu, "linear"); }),
            "no linear kernel named 'linear' (registered: )");
  EXPECT_EQ(test::error_of([] {
              kernel_registry().set_default(OpKind::linear, DeviceKind::cpu, "linear_test_on_cuda");
            }),
            "kernel 'linear_test_on_cuda' runs on cuda, not cpu");
}

TEST(Registry, DefaultKernelPerDtype) {
  // As CUDA's attention: one kernel for every dtype, another for bf16 slots alone.
  KernelRegistry r;
  const AttentionKernel attention{attention_forward_reference, attention_backward_reference,
                                  nullptr};
  r.add({"attention_any_test",
         OpKind::attention,
         {DType::f32, DType::bf16},
         "test only",
         attention,
         DeviceKind::cuda});
  r.add({"attention_bf16_test",
         OpKind::attention,
         {DType::bf16},
         "test only",
         attention,
         DeviceKind::cuda});
  r.set_default(OpKind::attention, DeviceKind::cuda, "attention_any_test");
  EXPECT_EQ(r.default_kernel(OpKind::attention, DeviceKind::cuda, DType::bf16),
            "attention_any_test");
  r.set_dtype_default(OpKind::attention, DeviceKind::cuda, DType::bf16, "attention_bf16_test");
  EXPECT_EQ(r.default_kernel(OpKind::attention, DeviceKind::cuda, DType::bf16),
            "attention_bf16_test");
  EXPECT_EQ(r.default_kernel(OpKind::attention, DeviceKind::cuda, DType::f32),
            "attention_any_test");
  EXPECT_EQ(r.default_kernel(OpKind::attention, DeviceKind::cuda), "attention_any_test");
  EXPECT_EQ(test::error_of([&] {
              r.set_dtype_default(OpKind::attention, DeviceKind::cuda, DType::f32,
                                  "attention_bf16_test");
            }),
            "kernel 'attention_bf16_test' does not take F32, so it cannot be that dtype's default");
  EXPECT_EQ(test::error_of([&] {
              r.set_dtype_default(OpKind::attention, DeviceKind::cpu, DType::bf16,
                                  "attention_bf16_test");
            }),
            "kernel 'attention_bf16_test' runs on cuda, not cpu");
  // No default for the (kind, device) at all: the dtype's alone does not make one.
  EXPECT_EQ(test::error_of([&] { r.default_kernel(OpKind::rope, DeviceKind::cuda, DType::f32); }),
            "no rope kernel is registered for cuda");
}

TEST(Overrides, ExpertsKernelConstraintIsCheckedUpFront) {
  // A registered experts kernel that takes at most 8 tokens.
  static const bool registered = [] {
    const ExpertsKernel& grouped =
        std::get<ExpertsKernel>(kernel_registry().get("experts_grouped", OpKind::experts).impl);
    kernel_registry().add(
        {"experts_test_8_tokens",
         OpKind::experts,
         {DType::f32},
         "test only",
         ExpertsKernel{grouped.forward, grouped.backward, [](const ExpertsShape& s) -> std::string {
                         return s.n_tokens <= 8 ? "" : "at most 8 tokens";
                       }}});
    return true;
  }();
  ASSERT_TRUE(registered);
  DecoderLM model(tiny_moe_args(), {{"*.experts", "experts_test_8_tokens"}});
  // It takes fp32 only: a model whose experts compute in bf16 refuses it before allocating.
  try {
    DecoderLM bf16(tiny_moe_args(), {{"*.experts", "experts_test_8_tokens"}}, DType::bf16);
    FAIL() << "an fp32-only experts kernel must be refused for bf16 experts";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "model.layers.1.mlp.experts: experts kernel 'experts_test_8_tokens' takes F32, the "
              "module needs BF16");
  }
  model.initialize(0);
  EXPECT_NO_THROW(model.check_kernel_constraints(2, 4));
  try {
    model.check_kernel_constraints(3, 3);
    FAIL() << "expected the experts kernel's constraint to fail";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "model.layers.1.mlp.experts: experts kernel 'experts_test_8_tokens' requires at most "
              "8 tokens");
  }
  std::vector<int32_t> ids(9, 1);
  EXPECT_THROW(model.forward(ids.data(), nullptr, 1, 9, {}), Error);
}

TEST(Overrides, KernelConstraintIsAnErrorNamingIt) {
  ModelArgs a = tiny_args();
  a.max_position_embeddings = 10000;
  a.attn_backend = "reference";
  DecoderLM model(a);
  model.initialize(0);
  std::vector<int32_t> ids(9000, 1);
  try {
    model.forward(ids.data(), nullptr, 1, 9000, {});
    FAIL() << "expected the reference attention's length constraint to fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_kv <= 8192"), std::string::npos) << e.what();
  }
}

TEST(Model, BadArgumentsNameTheField) {
  ModelArgs a = tiny_args();
  a.num_key_value_heads = 3;
  EXPECT_THROW(DecoderLM{a}, Error);
  a = tiny_args();
  a.hidden_size = 0;
  EXPECT_THROW(DecoderLM{a}, Error);
  a = tiny_args();
  a.attn_backend = "sdpa_magic";
  EXPECT_THROW(DecoderLM{a}, Error);
}

TEST(Model, InitialisationFollowsHuggingFace) {
  ModelArgs a = tiny_args();
  a.vocab_size = 4096;
  DecoderLM model(a);
  model.initialize(7);
  const ParamGroup& g0 = model.param_groups()[0];
  const ParamView& emb = g0.view("model.embed_tokens.weight");
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < emb.numel; ++i) {
    const double x = g0.params()[emb.offset + i];
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / emb.numel, stddev = std::sqrt(sum_sq / emb.numel - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(stddev, 0.02, 5e-4);
  const ParamView& norm = g0.view("model.norm.weight");
  for (int64_t i = 0; i < norm.numel; ++i) EXPECT_EQ(g0.params()[norm.offset + i], 1.0f);
  // Same seed, same weights, whatever the build order.
  DecoderLM again(a);
  again.initialize(7);
  EXPECT_EQ(0, std::memcmp(g0.params(), again.param_groups()[0].params(), 4 * g0.numel()));
}

}  // namespace
}  // namespace titan
