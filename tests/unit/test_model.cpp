// Model-level properties the trainer relies on: activation checkpointing changes memory, not
// results (dense and MoE); the arena is the size activation_bytes says; micro-batches normalised
// by the global token count add up to the big batch's gradients; a LoRA run under none remakes
// the norms' outputs, to the bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"
#include "tiny_models.h"
#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/registry.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/lora.h"
#include "titan/models/param_count.h"
#include "titan/ops/attention.h"

namespace titan {
namespace {

ModelArgs small_args() {
  ModelArgs a;
  a.vocab_size = 211;
  a.hidden_size = 32;
  a.intermediate_size = 48;
  a.num_hidden_layers = 3;
  a.num_attention_heads = 4;
  a.num_key_value_heads = 2;
  a.head_dim = 16;
  a.tie_word_embeddings = false;
  return a;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(n);
  Rng rng(seed);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.next_u64() % vocab);
  return ids;
}

std::vector<float> all_grads(const CausalLM& m) {
  std::vector<float> out;
  for (const ParamGroup& g : m.param_groups())
    out.insert(out.end(), g.grads(), g.grads() + g.numel());
  return out;
}

// One forward/backward under `checkpointing`: the loss, every gradient, the load-balancing loss,
// the arena size the model claims and the activation bytes it took.
struct CheckpointedStep {
  double loss = 0.0;
  std::vector<float> grads;
  double aux = 0.0;
  int64_t arena = 0;
  int64_t taken = 0;
};

// One step's forward (loss sum) and backward under `checkpointing`, and the activation bytes the
// forward took from the allocator.
std::pair<double, int64_t> forward_backward(DecoderLM& m, const std::vector<int32_t>& ids,
                                            int64_t batch, int64_t seq,
                                            const ActivationCheckpointing& checkpointing) {
  m.set_activation_checkpointing(checkpointing);
  ForwardOptions o;
  o.compute_grad = true;
  o.grad_scale = 0.01f;
  const size_t before = memory_stats().current[static_cast<size_t>(MemCategory::activations)];
  const double loss = m.forward(ids.data(), ids.data(), batch, seq, o).loss_sum;
  const size_t after = memory_stats().current[static_cast<size_t>(MemCategory::activations)];
  m.backward();
  return {loss, static_cast<int64_t>(after - before)};
}

CheckpointedStep checkpointed_step(const ModelArgs& args, const std::vector<int32_t>& ids,
                                   int64_t batch, int64_t seq,
                                   const ActivationCheckpointing& checkpointing,
                                   DType compute = DType::f32) {
  DecoderLM m(args, {}, compute);
  m.initialize(3);
  m.allocate_gradients();
  const auto [loss, taken] = forward_backward(m, ids, batch, seq, checkpointing);
  return {loss, all_grads(m), m.aux_loss(), m.activation_bytes(batch, seq), taken};
}

// Every mode that recomputes against none, on `args` made 4 layers deep, in fp32 and bf16 (bf16
// compute keeps the linears' inputs and the MLP's gate/up in bf16, computing their fp32 values in
// scratch every layer shares: recomputation must refill both): the same loss, gradients and
// load-balancing loss to the bit -- recomputation runs the same kernels on the same inputs -- and
// less memory, the selective modes more than full's. "2" recomputes layers 1 and 3, which share
// one set; "3" recomputes layer 2 alone, whose shared set is as large as its own: none's bytes.
void expect_checkpointing_changes_memory_not_results(ModelArgs args, int64_t batch, int64_t seq,
                                                     uint64_t seed) {
  args.num_hidden_layers = 4;
  const std::vector<int32_t> ids = random_ids(batch * seq, args.vocab_size, seed);
  for (const DType compute : {DType::f32, DType::bf16}) {
    const CheckpointedStep kept =
        checkpointed_step(args, ids, batch, seq, ActivationCheckpointing::none(), compute);
    const CheckpointedStep full =
        checkpointed_step(args, ids, batch, seq, ActivationCheckpointing::full(), compute);
    EXPECT_EQ(kept.taken, kept.arena);
    for (const ActivationCheckpointing& mode :
         {ActivationCheckpointing::full(), ActivationCheckpointing::ops(),
          ActivationCheckpointing::every_nth_layer(2),
          ActivationCheckpointing::every_nth_layer(3)}) {
      const std::string where = std::string(dtype_name(compute)) + ", " + mode.name();
      const CheckpointedStep recomputed = checkpointed_step(args, ids, batch, seq, mode, compute);
      EXPECT_EQ(recomputed.loss, kept.loss) << where;
      ASSERT_EQ(kept.grads.size(), recomputed.grads.size());
      EXPECT_EQ(0, std::memcmp(kept.grads.data(), recomputed.grads.data(),
                               kept.grads.size() * sizeof(float)))
          << where;
      EXPECT_EQ(recomputed.aux, kept.aux) << where;
      EXPECT_EQ(recomputed.taken, recomputed.arena) << where;
      if (mode == ActivationCheckpointing::every_nth_layer(3)) {
        EXPECT_EQ(recomputed.arena, kept.arena) << where;
        continue;
      }
      EXPECT_LT(recomputed.arena, kept.arena) << where;
      if (mode != ActivationCheckpointing::full()) {
        EXPECT_GT(recomputed.arena, full.arena) << where;
      }
    }
  }
}

TEST(Model, ActivationCheckpointingKeepsGradientsAndSavesMemory) {
  expect_checkpointing_changes_memory_not_results(small_args(), 2, 37, 1);
  // Llama's blocks: no q/k norms (q and k kept after RoPE), biases on every linear.
  ModelArgs llama = small_args();
  llama.architecture = "LlamaForCausalLM";
  llama.qk_norm = false;
  llama.attention_bias = llama.o_proj_bias = llama.mlp_bias = true;
  expect_checkpointing_changes_memory_not_results(llama, 2, 19, 2);
}

// One LoRA step (rank 4 on every projection, A and B random so that each of A's and B's
// gradients reads the adapted linears' inputs) under `checkpointing`: the loss, the adapter's
// gradients, the arena size the model claims and the activation bytes it took.
CheckpointedStep lora_step(const ModelArgs& args, const std::vector<int32_t>& ids, int64_t batch,
                           int64_t seq, const ActivationCheckpointing& checkpointing,
                           DType compute) {
  DecoderLM m(args, {}, compute);
  LoraAdapter adapter(args, {4, 8.0, lora_module_names()});
  m.attach_lora(adapter);
  m.initialize(3);
  m.allocate_gradients();
  adapter.allocate_gradients();
  Rng rng(5);
  for (ParamGroup& g : adapter.groups()) rng.fill_normal(g.params(), g.numel(), 0.0f, 0.1f);
  adapter.zero_gradients();
  const auto [loss, taken] = forward_backward(m, ids, batch, seq, checkpointing);
  std::vector<float> grads;
  for (const ParamGroup& g : adapter.groups())
    grads.insert(grads.end(), g.grads(), g.grads() + g.numel());
  return {loss, grads, 0.0, m.activation_bytes(batch, seq), taken};
}

// A LoRA run under none keeps no RMSNorm outputs (remade in the backward, as selective op): the
// same loss and adapter gradients to the bit as the modes that keep them (full keeps them in its
// recomputed layers' set, "2" in the layers it does not recompute), in the arena selective op
// carves for the model without LoRA, which titan plan's activation_bytes_of gives.
TEST(Model, LoraRemakesTheNormsUnderNone) {
  ModelArgs args = small_args();
  args.num_hidden_layers = 4;
  const int64_t batch = 2, seq = 19;
  const std::vector<int32_t> ids = random_ids(batch * seq, args.vocab_size, 4);
  for (const DType compute : {DType::f32, DType::bf16}) {
    const std::string dtype(dtype_name(compute));
    const CheckpointedStep none =
        lora_step(args, ids, batch, seq, ActivationCheckpointing::none(), compute);
    EXPECT_EQ(none.taken, none.arena) << dtype;
    EXPECT_EQ(none.arena,
              DecoderLM::activation_bytes_of(args, compute, ActivationCheckpointing::none(), batch,
                                             seq, {.lora = true}))
        << dtype;
    EXPECT_EQ(none.arena, DecoderLM::activation_bytes_of(
                              args, compute, ActivationCheckpointing::ops(), batch, seq))
        << dtype;
    EXPECT_LT(none.arena, DecoderLM::activation_bytes_of(
                              args, compute, ActivationCheckpointing::none(), batch, seq))
        << dtype;
    for (const ActivationCheckpointing& mode :
         {ActivationCheckpointing::full(), ActivationCheckpointing::every_nth_layer(2)}) {
      const std::string where = dtype + ", " + mode.name();
      const CheckpointedStep kept = lora_step(args, ids, batch, seq, mode, compute);
      EXPECT_EQ(kept.loss, none.loss) << where;
      ASSERT_EQ(kept.grads.size(), none.grads.size()) << where;
      EXPECT_EQ(
          0, std::memcmp(kept.grads.data(), none.grads.data(), kept.grads.size() * sizeof(float)))
          << where;
      EXPECT_EQ(kept.arena,
                DecoderLM::activation_bytes_of(args, compute, mode, batch, seq, {.lora = true}))
          << where;
      EXPECT_EQ(kept.arena, DecoderLM::activation_bytes_of(args, compute, mode, batch, seq))
          << where;
    }
  }
}

// One bf16 training step of small_args() (seed 3) with `overrides` on ids as inputs and targets:
// the loss sum and every gradient.
std::pair<double, std::vector<float>> bf16_step(const std::vector<OverrideRule>& overrides,
                                                const std::vector<int32_t>& ids, int64_t batch,
                                                int64_t seq) {
  DecoderLM m(small_args(), overrides, DType::bf16);
  m.initialize(3);
  m.allocate_gradients();
  ForwardOptions o;
  o.compute_grad = true;
  o.grad_scale = 0.01f;
  const double loss = m.forward(ids.data(), ids.data(), batch, seq, o).loss_sum;
  m.backward();
  return {loss, all_grads(m)};
}

// A swiglu kernel without the bf16 forms (any kernel may be bound to the slot) trains under bf16
// on the kept gate and up widened: given the built-in's fp32 pair, it computes bit for bit what
// the built-in's bf16 forms do.
TEST(Model, Bf16SwigluWithoutBf16FormsMatchesTheBuiltInBitForBit) {
  static const bool registered = [] {
    const auto& builtin =
        std::get<SwigluKernel>(kernel_registry().get("swiglu", OpKind::swiglu).impl);
    kernel_registry().add({"swiglu_fp32_forms_only",
                           OpKind::swiglu,
                           {DType::f32},
                           "test only",
                           SwigluKernel{builtin.forward, builtin.backward}});
    return true;
  }();
  ASSERT_TRUE(registered);
  const int64_t batch = 2, seq = 19;
  const std::vector<int32_t> ids = random_ids(batch * seq, 211, 5);
  const auto [builtin_loss, builtin_grads] = bf16_step({}, ids, batch, seq);
  const auto [widened_loss, widened_grads] =
      bf16_step({{"*.mlp", "swiglu_fp32_forms_only"}}, ids, batch, seq);
  EXPECT_EQ(builtin_loss, widened_loss);
  ASSERT_EQ(builtin_grads.size(), widened_grads.size());
  EXPECT_EQ(0, std::memcmp(builtin_grads.data(), widened_grads.data(),
                           builtin_grads.size() * sizeof(float)));
}

// An attention kernel without a bf16 forward trains under bf16 attending in fp32 on q, k and v
// rounded in place; one with it reads only the kept bits. A bf16 forward that widens the bits and
// runs the fp32 forward must therefore give, bit for bit, what the kernel without one gives.
void attention_fp32_on_widened_bits(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                                    const uint16_t* v, const AttentionShape& s) {
  const auto widened = [](const uint16_t* bits, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(bits[i]);
    return x;
  };
  const int64_t n_q = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t n_kv = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  attention_forward_blockwise(out, lse, widened(q, n_q).data(), widened(k, n_kv).data(),
                              widened(v, n_kv).data(), s);
}

TEST(Model, Bf16AttentionWithoutBf16ForwardAttendsOnTheRoundedValues) {
  static const bool registered = [] {
    // The built-in's fp32 pair and bf16 backward, with the given bf16 forward.
    const auto add = [](const char* name, AttentionForwardBf16 forward_bf16) {
      AttentionKernel kernel{attention_forward_blockwise, attention_backward_blockwise, {}};
      kernel.backward_bf16 = attention_backward_blockwise_bf16;
      kernel.forward_bf16 = forward_bf16;
      kernel_registry().add({name, OpKind::attention, {DType::f32}, "test only", kernel});
    };
    add("attention_fp32_forward_only", nullptr);
    add("attention_bf16_forward_widening", attention_fp32_on_widened_bits);
    return true;
  }();
  ASSERT_TRUE(registered);
  const int64_t batch = 2, seq = 19;
  const std::vector<int32_t> ids = random_ids(batch * seq, 211, 7);
  const auto step = [&](const char* kernel) {
    return bf16_step({{"*.self_attn", kernel}}, ids, batch, seq);
  };
  const auto [fallback_loss, fallback_grads] = step("attention_fp32_forward_only");
  const auto [widening_loss, widening_grads] = step("attention_bf16_forward_widening");
  const auto [builtin_loss, builtin_grads] = step("attention_blockwise");
  EXPECT_EQ(fallback_loss, widening_loss);
  ASSERT_EQ(fallback_grads.size(), widening_grads.size());
  EXPECT_EQ(0, std::memcmp(fallback_grads.data(), widening_grads.data(),
                           fallback_grads.size() * sizeof(float)));
  // The built-in's bf16 forward also rounds the probabilities: a different step.
  EXPECT_NE(builtin_loss, fallback_loss);
}

// What bf16 training keeps per dense layer, against fp32: its two norms' outputs (the linears'
// inputs), the q/k norms' inputs, v and the attention output, and the MLP's gate and up at half
// the bytes (the MLP's product is kept in neither, nor are q and k after their norms and RoPE:
// the backward recomputes them); the statistics stay fp32. Measured as the arena's growth per
// layer, so the shared scratch cancels out.
TEST(Model, Bf16TrainingKeepsTheLinearInputsAttentionInputsAndTheMlpInBf16) {
  const int64_t batch = 2, seq = 16, n = batch * seq;
  ModelArgs one = small_args(), two = small_args();
  one.num_hidden_layers = 1;
  two.num_hidden_layers = 2;
  const auto per_layer = [&](DType compute) {
    return DecoderLM::activation_bytes_of(two, compute, ActivationCheckpointing::none(), batch,
                                          seq) -
           DecoderLM::activation_bytes_of(one, compute, ActivationCheckpointing::none(), batch,
                                          seq);
  };
  ASSERT_TRUE(one.qk_norm);
  const int64_t h = one.hidden_size, I = one.intermediate_size;
  const int64_t q = one.num_attention_heads * one.head_dim;
  const int64_t kv = one.num_key_value_heads * one.head_dim;
  // q_pre, k_pre; v; out.
  const int64_t attention = (q + kv) + kv + q;
  const int64_t halved =
      (2 * n * h + n * attention + 2 * n * I) * static_cast<int64_t>(sizeof(uint16_t));
  EXPECT_EQ(per_layer(DType::f32) - per_layer(DType::bf16), halved);
}

// small_args() with layers 0 and 2 sparse (5 experts, 2 per token) and layer 1 dense; the wide
// init spreads the routers so routing is far from ties.
ModelArgs small_moe_args(bool aux) {
  ModelArgs a = test::with_moe(small_args(), 5, 2, 24, {1});
  a.output_router_logits = aux;
  a.initializer_range = 0.2;
  return a;
}

// Layers 0, 2 and 3 sparse, 1 dense. The shared layer set of checkpointing holds each MLP kind its
// layers have ("2": layers 1 and 3, both kinds, as under full, in bf16 a dense layer's kept values
// beside a sparse layer's fp32 ones; "3": layer 2's sparse); the router and the experts are
// recomputed with their layer, or kept whole under op.
TEST(Model, MoeActivationCheckpointingKeepsGradientsAndTheArenaIsWhatActivationBytesSays) {
  const ModelArgs args = small_moe_args(true);
  expect_checkpointing_changes_memory_not_results(args, 3, 11, 4);
  const std::vector<int32_t> ids = random_ids(3 * 11, args.vocab_size, 4);
  EXPECT_GT(checkpointed_step(args, ids, 3, 11, ActivationCheckpointing::none()).aux, 0.0);
}

TEST(Model, MoeInitialisationFollowsHuggingFace) {
  ModelArgs a = small_moe_args(false);
  a.initializer_range = 0.02;
  DecoderLM m(a);
  m.initialize(9);
  const ParamGroup& g = m.param_groups()[1];  // layer 0, sparse
  for (const char* name : {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_proj",
                           "model.layers.0.mlp.experts.down_proj"}) {
    const ParamView& v = g.view(name);
    double sum_sq = 0.0;
    for (int64_t i = 0; i < v.numel; ++i) sum_sq += std::pow(g.params()[v.offset + i], 2);
    EXPECT_NEAR(std::sqrt(sum_sq / v.numel), 0.02, 2e-3) << name;
  }
}

TEST(Model, MicroBatchesAddUpToTheGlobalBatch) {
  const int64_t batch = 4, seq = 19;
  std::vector<int32_t> ids = random_ids(batch * seq, 211, 2), labels = ids;
  for (int64_t s = 0; s < 7; ++s) labels[2 * seq + s] = -100;  // uneven valid counts per row
  int64_t valid = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 1; s < seq; ++s) valid += labels[b * seq + s] != -100;
  }
  ForwardOptions o;
  o.compute_grad = true;
  o.grad_scale = 1.0f / static_cast<float>(valid);

  DecoderLM whole(small_args());
  whole.initialize(5);
  whole.allocate_gradients();
  const CrossEntropyResult big = whole.forward(ids.data(), labels.data(), batch, seq, o);
  whole.backward();

  DecoderLM parts(small_args());
  parts.initialize(5);
  parts.allocate_gradients();
  double loss_sum = 0.0;
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t off = half * 2 * seq;
    loss_sum += parts.forward(ids.data() + off, labels.data() + off, 2, seq, o).loss_sum;
    parts.backward();
  }
  EXPECT_NEAR(loss_sum, big.loss_sum, 1e-9 * big.loss_sum + 1e-4);
  const std::vector<float> g_big = all_grads(whole), g_parts = all_grads(parts);
  // Same math, different summation order over the batch inside the GEMMs.
  testing::expect_close("accumulated gradients", g_parts.data(), g_big.data(), g_big.size(), 1e-5);
}

// Packed rows (ForwardOptions::segment_start): sequences of 40, 1 and 50 tokens and 9 of padding
// in one row of 100, one of 100 in the other (a one-token sequence, a row holding one sequence)
// compute what each sequence computes alone, batch 1 and its own length: the loss sum, the scored
// tokens and every gradient, in fp32 to summation order (the GEMMs see other row counts; bf16's
// packed attention is bounded in test_ops). Each sequence's last label is -100, as a packer sets it
// (it would predict the next sequence's first token). Without segment starts the next forward
// attends across the whole row again (positions reset).
TEST(Model, PackedRowsComputeWhatEachSequenceComputesAlone) {
  const int64_t batch = 2, seq = 100;
  const std::vector<std::vector<int64_t>> rows = {{40, 1, 50, 9}, {100}};  // 9: padding
  const std::vector<int32_t> ids = random_ids(batch * seq, 211, 7);
  std::vector<int32_t> labels = random_ids(batch * seq, 211, 8), starts;
  std::vector<std::pair<int64_t, int64_t>> sequences;  // (first token, length), padding aside
  for (int64_t b = 0; b < batch; ++b) {
    int64_t at = b * seq;
    for (size_t n = 0; n < rows[b].size(); ++n) {
      const int64_t len = rows[b][n];
      const bool padding = b == 0 && n == 3;
      for (int64_t i = 0; i < len; ++i) {
        starts.push_back(static_cast<int32_t>(at - b * seq));
        if (padding) labels[at + i] = -100;
      }
      labels[at + len - 1] = -100;
      if (!padding) sequences.emplace_back(at, len);
      at += len;
    }
  }
  {
    ForwardOptions o;
    o.compute_grad = true;
    o.grad_scale = 0.01f;
    DecoderLM packed(small_args());
    packed.initialize(5);
    packed.allocate_gradients();
    o.segment_start = starts.data();
    const CrossEntropyResult together = packed.forward(ids.data(), labels.data(), batch, seq, o);
    packed.backward();

    DecoderLM alone(small_args());
    alone.initialize(5);
    alone.allocate_gradients();
    o.segment_start = nullptr;
    double loss_sum = 0.0;
    int64_t scored = 0;
    for (const auto& [first, len] : sequences) {
      const CrossEntropyResult r =
          alone.forward(ids.data() + first, labels.data() + first, 1, len, o);
      alone.backward();
      loss_sum += r.loss_sum;
      scored += r.n_scored;
    }
    EXPECT_EQ(together.n_scored, scored);
    EXPECT_NEAR(together.loss_sum, loss_sum, 1e-5 * loss_sum);
    const std::vector<float> g_packed = all_grads(packed), g_alone = all_grads(alone);
    testing::expect_close("packed gradients", g_packed.data(), g_alone.data(), g_alone.size(),
                          1e-5);

    // A kernel that does not say it takes packed rows (a plugin's, say) is refused for them in
    // one line rather than let attend across sequences.
    static const bool registered = [] {
      kernel_registry().add(
          {"attention_one_sequence_per_row",
           OpKind::attention,
           {DType::f32},
           "test only",
           AttentionKernel{attention_forward_blockwise, attention_backward_blockwise, {}}});
      return true;
    }();
    ASSERT_TRUE(registered);
    DecoderLM unaware(small_args(), {{"*.self_attn", "attention_one_sequence_per_row"}});
    unaware.initialize(5);
    o.compute_grad = false;
    o.segment_start = starts.data();
    try {
      unaware.forward(ids.data(), labels.data(), batch, seq, o);
      ADD_FAILURE() << "packed rows ran on a kernel that does not take them";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(),
                   "model.layers.0.self_attn: attention kernel 'attention_one_sequence_per_row' "
                   "requires one sequence per row (it does not take packed rows)");
    }

    // The same model, rows no longer packed: one sequence per row, as a fresh model computes.
    DecoderLM plain(small_args());
    plain.initialize(5);
    plain.allocate_gradients();
    ForwardOptions no_grad;
    EXPECT_EQ(packed.forward(ids.data(), labels.data(), batch, seq, no_grad).loss_sum,
              plain.forward(ids.data(), labels.data(), batch, seq, no_grad).loss_sum);
  }
}

// count_parameters (titan info, the planner) from ModelArgs alone agrees with the model built from
// them, whatever the family's blocks hold.
TEST(Model, ParameterCountsFollowTheFamilysBlocks) {
  ModelArgs biased = small_args();  // Llama with attention_bias and mlp_bias
  biased.architecture = "LlamaForCausalLM";
  biased.qk_norm = false;
  biased.attention_bias = biased.o_proj_bias = biased.mlp_bias = true;
  ModelArgs qwen2 = biased;
  qwen2.architecture = "Qwen2ForCausalLM";
  qwen2.o_proj_bias = qwen2.mlp_bias = false;
  for (const ModelArgs& a : {small_args(), biased, qwen2, small_moe_args(false)}) {
    EXPECT_EQ(count_parameters(a).total, DecoderLM(a).parameter_count());
  }
  EXPECT_EQ(count_parameters(biased).total - count_parameters(small_args()).total,
            3 * (-2 * 16 + (64 + 2 * 32) + 32 + (2 * 48 + 32)));
}

// The hooks a parallelism attaches to bracket every use of every parameter group, as FSDP needs:
// released parameters are poisoned (NaN) and restored on acquire, and each use's gradients are
// moved out of the group at its release (what FSDP's reduce-scatter does) -- the loss and the
// gradients summed over the uses still equal a run without hooks, bit for bit, with and without
// activation checkpointing, tied and untied (the [norm, lm_head] unit last). The order of the
// uses is the documented one, each release says when the group is used again, each acquire what
// the use reads (a use that reads nothing is left the poisoned parameters), and after an acquire
// the model names the group it acquires next (what FSDP prefetches).
TEST(Model, ParamGroupHooksBracketEveryUse) {
  const int64_t batch = 2, seq = 9;
  const std::vector<int32_t> ids = random_ids(batch * seq, 211, 8);
  // Events: a/A acquire without/with gradients, p prefetch, each followed by the group and what
  // the use reads: nothing more for its parameters, c through copies, g nothing (gradients only);
  // the release's end: r last, l used_later, n used_next, R gradients.
  const std::string end_codes = "rlnR";
  const auto reads_code = [](GroupReads reads) {
    return reads == GroupReads::parameters ? "" : reads == GroupReads::through_copies ? "c" : "g";
  };
  struct Case {
    bool tied, compute_grad;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {false, true, {"a0", "p1", "l0", "a1", "p2", "l1", "a2", "p3", "l2", "a3", "p4c", "n3", "A4c",
                     "p3", "R4", "A3", "p2", "R3", "A2", "p1", "R2", "A1", "R1", "A0g", "R0"}},
      {true, true, {"a0", "p1", "l0", "a1", "p2", "l1", "a2", "p3", "l2", "a3", "p0c", "n3", "A0c",
                    "p3", "R0", "A3", "p2", "R3", "A2", "p1", "R2", "A1", "R1", "A0g", "R0"}},
      // Evaluation: no use is followed by another of the same group, but the tied embedding's.
      {false,
       false,
       {"a0", "p1", "r0", "a1", "p2", "r1", "a2", "p3", "r2", "a3", "p4c", "r3", "a4c", "r4"}},
      {true,
       false,
       {"a0", "p1", "l0", "a1", "p2", "r1", "a2", "p3", "r2", "a3", "p0c", "r3", "a0c", "r0"}},
  };
  for (const Case& c : cases) {
    for (const ActivationCheckpointing& checkpointing :
         {ActivationCheckpointing::none(), ActivationCheckpointing::full(),
          ActivationCheckpointing::ops(), ActivationCheckpointing::every_nth_layer(2)}) {
      ModelArgs args = small_args();
      args.tie_word_embeddings = c.tied;
      ForwardOptions o;
      o.compute_grad = c.compute_grad;
      o.grad_scale = 0.1f;
      const std::string where = std::string(c.tied ? "tied" : "untied") +
                                (c.compute_grad ? ", training" : ", evaluation") +
                                ", checkpointing " + checkpointing.name();
      DecoderLM plain(args);
      plain.initialize(5);
      plain.allocate_gradients();
      plain.set_activation_checkpointing(checkpointing);
      const double want_loss = plain.forward(ids.data(), ids.data(), batch, seq, o).loss_sum;
      if (c.compute_grad) plain.backward();

      DecoderLM m(args);
      m.initialize(5);
      m.allocate_gradients();
      m.set_activation_checkpointing(checkpointing);
      std::vector<ParamGroup>& groups = m.param_groups();
      ASSERT_EQ(groups.size(), c.tied ? 4u : 5u);
      std::vector<std::vector<float>> saved, grad_sums;
      for (const ParamGroup& g : groups) {
        saved.emplace_back(g.params(), g.params() + g.numel());
        grad_sums.emplace_back(g.numel(), 0.0f);
        std::fill(g.params(), g.params() + g.numel(), std::nanf(""));
      }
      std::vector<std::string> events;
      ParamGroupHooks hooks;
      hooks.acquire = [&](int64_t i, bool gradients, GroupReads reads) {
        events.push_back((gradients ? "A" : "a") + std::to_string(i) + reads_code(reads));
        if (reads != GroupReads::nothing) {
          std::copy(saved[i].begin(), saved[i].end(), groups[i].params());
        }
      };
      hooks.release = [&](int64_t i, GroupUseEnd end) {
        events.push_back(end_codes[static_cast<size_t>(end)] + std::to_string(i));
        ParamGroup& g = groups[i];
        std::fill(g.params(), g.params() + g.numel(), std::nanf(""));
        if (end != GroupUseEnd::gradients) return;
        for (int64_t k = 0; k < g.numel(); ++k) grad_sums[i][k] += g.grads()[k];
        std::fill(g.grads(), g.grads() + g.numel(), 0.0f);
      };
      hooks.prefetch = [&](int64_t i, GroupReads reads) {
        events.push_back("p" + std::to_string(i) + reads_code(reads));
      };
      m.set_param_group_hooks(hooks);
      const double loss = m.forward(ids.data(), ids.data(), batch, seq, o).loss_sum;
      if (c.compute_grad) m.backward();
      EXPECT_EQ(loss, want_loss) << where;
      // Each prefetch names the group acquired next.
      EXPECT_EQ(events, c.want) << where;
      if (!c.compute_grad) continue;
      for (size_t i = 0; i < groups.size(); ++i) {
        const ParamGroup& p = plain.param_groups()[i];
        EXPECT_EQ(0, std::memcmp(grad_sums[i].data(), p.grads(), p.numel() * sizeof(float)))
            << "group " << i << ", " << where;
      }
    }
  }
}

// A unit's memory may move between its uses, as a device allocator that frees it moves it: with
// every group moved to new buffers at each acquire and release (the parameters poisoned before
// they move out), a training step computes the same loss and gradients to the bit, dense and MoE,
// fp32 and bf16, tied or not, because the model rebinds its modules at each use.
TEST(Model, UnitsMayMoveBetweenUses) {
  const int64_t batch = 2, seq = 9;
  const std::vector<int32_t> ids = random_ids(batch * seq, 211, 12);
  for (const bool moe : {false, true}) {
    for (const bool tied : {false, true}) {
      for (const DType dtype : {DType::f32, DType::bf16}) {
        ModelArgs args = small_args();
        args.tie_word_embeddings = tied;
        if (moe) args = test::with_moe(args, 4, 2, 16, {1});
        const std::string where = std::string(moe ? "moe" : "dense") + (tied ? ", tied" : "") +
                                  ", " + std::string(dtype_name(dtype));
        ForwardOptions o;
        o.compute_grad = true;
        o.grad_scale = 0.1f;
        DecoderLM plain(args, {}, dtype);
        plain.initialize(6);
        plain.allocate_gradients();
        const double want_loss = plain.forward(ids.data(), ids.data(), batch, seq, o).loss_sum;
        plain.backward();

        DecoderLM m(args, {}, dtype);
        m.initialize(6);
        m.allocate_gradients();
        std::vector<ParamGroup>& groups = m.param_groups();
        std::vector<std::vector<float>> saved;
        for (const ParamGroup& g : groups) saved.emplace_back(g.params(), g.params() + g.numel());
        ParamGroupHooks hooks;
        hooks.acquire = [&](int64_t i, bool, GroupReads) {
          groups[i].move_storage();
          std::copy(saved[i].begin(), saved[i].end(), groups[i].params());
        };
        // The gradients move with their contents (accumulated across uses, as in place).
        hooks.release = [&](int64_t i, GroupUseEnd) {
          ParamGroup& g = groups[i];
          std::fill(g.params(), g.params() + g.numel(), std::nanf(""));
          g.move_storage();
        };
        m.set_param_group_hooks(hooks);
        EXPECT_EQ(m.forward(ids.data(), ids.data(), batch, seq, o).loss_sum, want_loss) << where;
        m.backward();
        for (size_t i = 0; i < groups.size(); ++i) {
          const ParamGroup& p = plain.param_groups()[i];
          EXPECT_EQ(0, std::memcmp(groups[i].grads(), p.grads(), p.numel() * sizeof(float)))
              << "group " << i << ", " << where;
        }
      }
    }
  }
}

}  // namespace
}  // namespace titan
