// The parallelize plan (models/parallelize.h): with degrees of 1 every parameter is whole and the
// model built through the plan is today's, bit for bit; on two tensor-parallel ranks each
// parameter's local part is the one torchtitan's Llama 3 / Qwen3 plan gives it (q/k/v and gate/up
// Shard(0), o and down Shard(1) with a replicated bias, the embedding and lm_head on the
// vocabulary, norms, q/k norms and the router whole), the experts cut by EP or by TP, and the
// parts of every rank cover each parameter once. Degrees that do not divide are refused naming
// the key. The layer's collective hook points are called where tensor parallel reduces. The runs a
// cut (or a TP cut then FSDP's dim-0 cut of it) holds equal an element-by-element reference, and
// each TP rank's initialisation is its cut of the whole model's. Under FSDP x EP an expert's FSDP
// cut is over the ranks holding the same experts, and every rank's parts cover each parameter once.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "error_of.h"
#include "tiny_models.h"
#include "titan/core/rng.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/flops.h"
#include "titan/models/parallelize.h"
#include "titan/models/param_count.h"
#include "titan/models/registry.h"
#include "titan/nn/shard_runs.h"

namespace titan {
namespace {

// tiny_dense with a vocabulary two ranks split evenly.
ModelArgs even_dense() {
  ModelArgs a = test::tiny_dense(false);
  a.vocab_size = 96;
  return a;
}

// One training micro-batch of random tokens (seed) through `m`: its loss sum and every gradient.
struct Step {
  double loss = 0.0;
  std::vector<float> grads;
};
Step one_step(CausalLM& m, uint64_t seed) {
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> ids(batch * seq + 1);
  Rng rng(seed);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.next_u64() % 97);
  const std::vector<int32_t> inputs(ids.begin(), ids.end() - 1), labels(ids.begin() + 1, ids.end());
  m.initialize(3);
  m.allocate_gradients();
  m.zero_gradients();
  ForwardOptions options;
  options.compute_grad = true;
  Step step;
  step.loss = m.forward(inputs.data(), labels.data(), batch, seq, options).loss_sum;
  m.backward();
  for (const ParamGroup& g : m.param_groups()) {
    step.grads.insert(step.grads.end(), g.grads(), g.grads() + g.numel());
  }
  return step;
}

ParallelAxes tp_rank(int64_t index, int64_t degree) {
  ParallelAxes axes;
  axes.tp_index = index;
  axes.tp_degree = degree;
  return axes;
}

// The local spec of `param` in `groups`.
const ParamSpec& find_spec(const std::vector<ParamGroupSpec>& groups, const std::string& param) {
  for (const ParamGroupSpec& g : groups) {
    for (const ParamSpec& p : g.params) {
      if (p.name == param) return p;
    }
  }
  throw std::runtime_error("no parameter " + param);
}

TEST(Parallelize, DegreesOfOneKeepEveryParameterWhole) {
  for (const ModelArgs& args :
       {test::tiny_dense(true), test::tiny_dense(false), test::tiny_moe()}) {
    const ParallelizePlan plan = parallelize_decoder(args, ParallelAxes{});
    const std::vector<ParamGroupSpec> whole = model_param_specs(args);
    const std::vector<ParamGroupSpec> local = local_param_specs(args, plan);
    ASSERT_EQ(local.size(), whole.size());
    for (size_t g = 0; g < whole.size(); ++g) {
      EXPECT_EQ(local[g].name, whole[g].name);
      ASSERT_EQ(local[g].params.size(), whole[g].params.size());
      for (size_t p = 0; p < whole[g].params.size(); ++p) {
        EXPECT_EQ(local[g].params[p].name, whole[g].params[p].name);
        EXPECT_EQ(local[g].params[p].shape, whole[g].params[p].shape) << whole[g].params[p].name;
        EXPECT_EQ(plan.placement_of(whole[g].params[p]).count, 1);
      }
    }
  }
}

// The same loss and gradients, to the bit, from the model built through a 1-rank plan.
TEST(Parallelize, OneRankPlanBuildsTodaysModel) {
  const ModelArgs args = test::tiny_moe();
  const std::unique_ptr<CausalLM> today = make_model(args);
  const std::unique_ptr<CausalLM> planned = make_model(args, {}, DType::f32, Residency::committed,
                                                       parallelize_decoder(args, ParallelAxes{}));
  const Step want = one_step(*today, 5), got = one_step(*planned, 5);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.grads, want.grads);
}

// The tensor-parallel reductions sit at both block boundaries of every layer, forward and
// backward: a hook that only counts (one rank's sum is the identity) leaves the step unchanged.
TEST(Parallelize, EveryLayerReducesAtItsTwoBlockBoundariesEachWay) {
  const ModelArgs args = test::tiny_moe();  // a sparse and a dense layer
  const std::unique_ptr<CausalLM> plain = make_model(args), hooked = make_model(args);
  int64_t calls = 0;
  LayerCollectives counting;
  counting.sum_partials = [&](float* x, int64_t count) {
    EXPECT_NE(x, nullptr);
    EXPECT_EQ(count, 2 * 8 * args.hidden_size);  // one_step's tokens x hidden
    ++calls;
  };
  hooked->set_layer_collectives(counting);
  const Step want = one_step(*plain, 9), got = one_step(*hooked, 9);
  EXPECT_EQ(calls, 2 * 2 * args.num_hidden_layers);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.grads, want.grads);
}

TEST(Parallelize, TwoTensorParallelRanksGetTorchtitansParts) {
  ModelArgs args = even_dense();
  args.architecture = "Qwen2ForCausalLM";  // q/k/v biases: Shard(0) beside their weights
  args.qk_norm = false;
  args.attention_bias = true;
  const int64_t h = 32, hd = 16, H = 4, KV = 2, I = 48, V = 96;
  for (int64_t r = 0; r < 2; ++r) {
    const ParallelizePlan plan = parallelize_decoder(args, tp_rank(r, 2));
    const std::vector<ParamGroupSpec> local = local_param_specs(args, plan);
    const auto shape = [&](const std::string& p) { return find_spec(local, p).shape; };
    const std::string l = "model.layers.1.";
    EXPECT_EQ(shape("model.embed_tokens.weight"), (Shape{V / 2, h}));
    EXPECT_EQ(shape(l + "input_layernorm.weight"), (Shape{h}));
    EXPECT_EQ(shape(l + "self_attn.q_proj.weight"), (Shape{H / 2 * hd, h}));
    EXPECT_EQ(shape(l + "self_attn.q_proj.bias"), (Shape{H / 2 * hd}));
    EXPECT_EQ(shape(l + "self_attn.k_proj.weight"), (Shape{KV / 2 * hd, h}));
    EXPECT_EQ(shape(l + "self_attn.v_proj.bias"), (Shape{KV / 2 * hd}));
    EXPECT_EQ(shape(l + "self_attn.o_proj.weight"), (Shape{h, H / 2 * hd}));
    EXPECT_EQ(shape(l + "mlp.gate_proj.weight"), (Shape{I / 2, h}));
    EXPECT_EQ(shape(l + "mlp.up_proj.weight"), (Shape{I / 2, h}));
    EXPECT_EQ(shape(l + "mlp.down_proj.weight"), (Shape{h, I / 2}));
    EXPECT_EQ(shape("model.norm.weight"), (Shape{h}));
    EXPECT_EQ(shape("lm_head.weight"), (Shape{V / 2, h}));

    const auto placement = [&](const std::string& p) {
      return plan.placement_of(find_spec(model_param_specs(args), p));
    };
    EXPECT_EQ(placement(l + "self_attn.q_proj.weight").dim, 0);
    EXPECT_EQ(placement(l + "self_attn.q_proj.weight").index, r);
    EXPECT_EQ(placement(l + "self_attn.o_proj.weight").dim, 1);
    EXPECT_EQ(placement(l + "mlp.down_proj.weight").dim, 1);
    EXPECT_EQ(placement(l + "post_attention_layernorm.weight").count, 1);
    EXPECT_EQ(plan.style_of(l + "input_layernorm"), ParallelStyle::sequence);
    EXPECT_EQ(plan.style_of("lm_head"), ParallelStyle::vocab);
  }

  // A row-wise linear's bias is added once, after the partial products are summed: whole.
  ModelArgs llama = even_dense();
  llama.architecture = "LlamaForCausalLM";
  llama.qk_norm = false;
  llama.attention_bias = true;
  llama.o_proj_bias = true;
  llama.mlp_bias = true;
  const ParallelizePlan plan = parallelize_decoder(llama, tp_rank(1, 2));
  const std::vector<ParamGroupSpec> local = local_param_specs(llama, plan);
  EXPECT_EQ(find_spec(local, "model.layers.0.self_attn.o_proj.bias").shape, (Shape{32}));
  EXPECT_EQ(find_spec(local, "model.layers.0.mlp.down_proj.bias").shape, (Shape{32}));
  EXPECT_EQ(find_spec(local, "model.layers.0.mlp.up_proj.bias").shape, (Shape{24}));
}

TEST(Parallelize, QkNormsAndTheRouterStayWholeExpertsCutByEpOrTp) {
  ModelArgs args = test::tiny_moe();  // layer 0: 4 experts of width 16; layer 1 dense
  args.vocab_size = 96;
  const std::string moe = "model.layers.0.mlp.";
  // Expert parallel over 2 ranks: whole experts, 2 each.
  ParallelAxes ep = tp_rank(0, 1);
  ep.ep_index = 1;
  ep.ep_degree = 2;
  const ParallelizePlan by_ep = parallelize_decoder(args, ep);
  const std::vector<ParamGroupSpec> ep_local = local_param_specs(args, by_ep);
  EXPECT_EQ(find_spec(ep_local, moe + "experts.gate_proj").shape, (Shape{2, 16, 32}));
  EXPECT_EQ(find_spec(ep_local, moe + "experts.down_proj").shape, (Shape{2, 32, 16}));
  EXPECT_EQ(by_ep.placement_of(find_spec(model_param_specs(args), moe + "experts.up_proj")).index,
            1);
  EXPECT_EQ(find_spec(ep_local, moe + "gate.weight").shape, (Shape{4, 32}));
  // Tensor parallel over 2 ranks and no EP: every expert's width cut.
  const std::vector<ParamGroupSpec> tp_local =
      local_param_specs(args, parallelize_decoder(args, tp_rank(0, 2)));
  EXPECT_EQ(find_spec(tp_local, moe + "experts.gate_proj").shape, (Shape{4, 8, 32}));
  EXPECT_EQ(find_spec(tp_local, moe + "experts.up_proj").shape, (Shape{4, 8, 32}));
  EXPECT_EQ(find_spec(tp_local, moe + "experts.down_proj").shape, (Shape{4, 32, 8}));
  EXPECT_EQ(find_spec(tp_local, moe + "gate.weight").shape, (Shape{4, 32}));
  EXPECT_EQ(find_spec(tp_local, "model.layers.0.self_attn.q_norm.weight").shape, (Shape{16}));
  EXPECT_EQ(find_spec(tp_local, "model.layers.0.self_attn.k_norm.weight").shape, (Shape{16}));
}

// FSDP 4 x EP 2 (torchtitan's mesh, distributed/mesh.h: EP index = shard index mod 2): an expert is
// FSDP-sharded over the 2 ranks holding the same experts (shard index / 2 of 2), every other
// parameter over all 4; the 4 ranks' parts of every parameter (the EP cut, then the FSDP cut of
// it) hold each element once. Without FSDP the cut stays whole.
TEST(Parallelize, FsdpTimesEpShardsTheExpertsOverTheRanksHoldingThem) {
  const ModelArgs args = test::tiny_moe();
  int64_t experts = 0;  // expert tensors met: the check covers them
  for (const ParamGroupSpec& g : model_param_specs(args)) {
    for (const ParamSpec& p : g.params) {
      std::vector<int> seen(static_cast<size_t>(shape_numel(p.shape)), 0);
      for (int64_t shard = 0; shard < 4; ++shard) {
        ParallelAxes axes;
        axes.ep_index = shard % 2;
        axes.ep_degree = 2;
        const ParallelizePlan plan = parallelize_decoder(args, axes);
        const Shard fsdp = plan.fsdp_cut_of(p, {shard, 4});
        const bool is_expert = plan.placement_of(p).count > 1;
        EXPECT_EQ(fsdp.index, is_expert ? shard / 2 : shard) << p.name;
        EXPECT_EQ(fsdp.count, is_expert ? 2 : 4) << p.name;
        EXPECT_EQ(plan.fsdp_cut_of(p, Shard{}).count, 1) << p.name;
        if (shard == 0 && is_expert) ++experts;
        for (const ShardRun& run : shard_box(p.shape, {plan.placement_of(p), fsdp}).runs) {
          for (int64_t i = 0; i < run.count; ++i) ++seen[static_cast<size_t>(run.whole_first + i)];
        }
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size())) << p.name;
    }
  }
  EXPECT_GT(experts, 0);
}

// FSDP x TP x EP (torchtitan's mesh: EP borrows dp_shard x tp, EP index = (shard index x tp + tp
// index) mod ep): dp_shard 2 x TP 2 x EP 2 and dp_shard 4 x TP 2 x EP 4 (an EP group spanning two
// shard indices). An expert is FSDP-sharded over the dp_shard x tp / ep ranks holding it (shard
// index / (ep / tp)); every other parameter's TP cut over dp_shard. Over all ranks each element of
// a cut parameter is held once, and of one replicated over the TP group once per tp index.
TEST(Parallelize, FsdpTimesTpTimesEpCoversEachElementOncePerCopy) {
  ModelArgs args = test::tiny_moe();
  args.vocab_size = 96;  // cut along the vocabulary by TP 2
  const int64_t tp = 2;
  for (const int64_t dp_shard : {2, 4}) {
    const int64_t ep = dp_shard;  // 2 (ep == tp) and 4 (ep == 2 tp)
    int64_t experts = 0;
    for (const ParamGroupSpec& g : model_param_specs(args)) {
      for (const ParamSpec& p : g.params) {
        std::vector<int> seen(static_cast<size_t>(shape_numel(p.shape)), 0);
        bool cut = false;
        for (int64_t shard = 0; shard < dp_shard; ++shard) {
          for (int64_t t = 0; t < tp; ++t) {
            ParallelAxes axes;
            axes.tp_index = t;
            axes.tp_degree = tp;
            axes.sequence_parallel = true;
            axes.ep_index = (shard * tp + t) % ep;
            axes.ep_degree = ep;
            const ParallelizePlan plan = parallelize_decoder(args, axes);
            const Shard fsdp = plan.fsdp_cut_of(p, {shard, dp_shard});
            const bool is_expert = plan.style_of(module_of_param(p.name)) == ParallelStyle::expert;
            EXPECT_EQ(fsdp.index, is_expert ? shard / (ep / tp) : shard) << p.name;
            EXPECT_EQ(fsdp.count, is_expert ? dp_shard * tp / ep : dp_shard) << p.name;
            if (shard == 0 && t == 0 && is_expert) ++experts;
            cut = plan.placement_of(p).count > 1;
            for (const ShardRun& run : shard_box(p.shape, {plan.placement_of(p), fsdp}).runs) {
              for (int64_t i = 0; i < run.count; ++i) {
                ++seen[static_cast<size_t>(run.whole_first + i)];
              }
            }
          }
        }
        const int copies = cut ? 1 : static_cast<int>(tp);
        EXPECT_EQ(std::count(seen.begin(), seen.end(), copies), static_cast<long>(seen.size()))
            << p.name << " under dp_shard " << dp_shard;
      }
    }
    EXPECT_GT(experts, 0);
  }
}

TEST(Parallelize, EveryRanksPartsCoverEachParameterOnce) {
  const ModelArgs args = even_dense();
  for (const ParamGroupSpec& g : model_param_specs(args)) {
    for (const ParamSpec& p : g.params) {
      int64_t covered = 0;
      for (int64_t r = 0; r < 2; ++r) {
        const ParallelizePlan plan = parallelize_decoder(args, tp_rank(r, 2));
        const Shard cut = plan.placement_of(p);
        const int64_t d = p.shape[static_cast<size_t>(cut.dim)];
        EXPECT_EQ(cut.first(d), cut.count == 1 ? 0 : r * d / 2) << p.name;
        covered += cut.count == 1 ? (r == 0 ? d : 0) : cut.size(d);
        EXPECT_EQ(shape_numel(plan.local_spec(p).shape) * cut.count, shape_numel(p.shape))
            << p.name;
      }
      EXPECT_EQ(covered, p.shape[static_cast<size_t>(
                             parallelize_decoder(args, tp_rank(0, 2)).placement_of(p).dim)])
          << p.name;
    }
  }
}

// The model takes its sizes from its parts; it refuses to compute without its TP group's
// reductions (test_tensor_parallel computes with them).
TEST(Parallelize, TheModelIsBuiltOnItsPartsAndRefusesToComputeWithoutCollectives) {
  const ModelArgs args = even_dense();
  const std::unique_ptr<CausalLM> m = make_model(args, {}, DType::f32, Residency::committed,
                                                 parallelize_decoder(args, tp_rank(1, 2)));
  const DecoderModules& modules = m->modules();
  EXPECT_EQ(modules.embed_tokens.vocab, 48);
  EXPECT_EQ(modules.lm_head.out_features, 48);
  const DecoderLayer& layer = modules.layers[0];
  EXPECT_EQ(layer.self_attn.n_heads, 2);
  EXPECT_EQ(layer.self_attn.n_kv_heads, 1);
  EXPECT_EQ(layer.self_attn.o_proj.in_features, 32);
  EXPECT_EQ(layer.self_attn.o_proj.out_features, 32);
  EXPECT_EQ(layer.mlp.intermediate, 24);
  EXPECT_EQ(layer.mlp.down_proj.in_features, 24);
  const std::vector<int32_t> ids(8, 1);
  ForwardOptions options;
  EXPECT_NE(test::error_of([&] {
              m->forward(ids.data(), ids.data(), 1, 8, options);
            }).find("its group's reductions are not set"),
            std::string::npos);
}

TEST(Parallelize, DegreesThatDoNotDivideAreRefusedNamingTheKey) {
  ModelArgs args = even_dense();  // 4 heads, 2 kv heads, MLP 48, vocab 96
  EXPECT_EQ(test::error_of([&] { parallelize_decoder(args, tp_rank(0, 4)); }),
            "parallelism.tensor_parallel_degree 4 must divide num_key_value_heads 2 (k_proj and "
            "v_proj are cut into whole key/value heads, as torchtitan does)");
  EXPECT_EQ(test::error_of([&] { parallelize_decoder(args, tp_rank(0, 3)); }),
            "parallelism.tensor_parallel_degree 3 must divide num_attention_heads 4 (q_proj and "
            "o_proj are cut into whole heads)");
  args.vocab_size = 97;
  EXPECT_EQ(test::error_of([&] { parallelize_decoder(args, tp_rank(0, 2)); }),
            "parallelism.tensor_parallel_degree 2 must divide vocab_size 97 (the embedding and "
            "the lm_head are cut along the vocabulary)");
  ModelArgs moe = test::tiny_moe();
  ParallelAxes ep;
  ep.ep_degree = 3;
  EXPECT_EQ(test::error_of([&] { parallelize_decoder(moe, ep); }),
            "parallelism.expert_parallel_degree 3 must divide num_experts 4 (each rank holds "
            "whole experts)");
  EXPECT_EQ(test::error_of([&] { parallelize_decoder(even_dense(), ep); }),
            "parallelism.expert_parallel_degree 3 needs a model with experts (Qwen3ForCausalLM "
            "has none)");
}

// Parameter counts and FLOPs come from the plan's local specs: the default plan gives the whole
// model's; two tensor-parallel ranks hold the whole model once plus each replicated parameter
// twice, and share a dense token's FLOPs exactly (every matmul and every head is cut); an
// expert-parallel rank holds half the experts yet does a whole token's FLOPs (its tokens' rows
// reach k experts, on whichever rank they live).
TEST(Parallelize, CountsAndFlopsComeFromTheLocalSpecs) {
  const ModelArgs dense = even_dense();
  const ParamCounts whole = count_parameters(dense);
  int64_t replicated = 0;
  const ParallelizePlan rank0 = parallelize_decoder(dense, tp_rank(0, 2));
  for (const ParamGroupSpec& g : model_param_specs(dense)) {
    for (const ParamSpec& p : g.params) {
      if (rank0.placement_of(p).count == 1) replicated += shape_numel(p.shape);
    }
  }
  EXPECT_GT(replicated, 0);
  int64_t total = 0, embedding = 0;
  double flops = 0.0, attention = 0.0;
  for (int64_t r = 0; r < 2; ++r) {
    const ParallelizePlan plan = parallelize_decoder(dense, tp_rank(r, 2));
    const ParamCounts c = count_parameters(dense, plan);
    EXPECT_EQ(c.active, c.total);
    total += c.total;
    embedding += c.embedding;
    flops += training_flops_per_token(dense, 64, plan);
    attention +=
        training_flops_per_token(dense, 64, plan) - training_flops_per_token(dense, 0, plan);
  }
  EXPECT_EQ(total, whole.total + replicated);
  EXPECT_EQ(embedding, whole.embedding);
  EXPECT_EQ(flops, training_flops_per_token(dense, 64));
  EXPECT_EQ(attention, 12.0 * 64 * dense.num_hidden_layers * dense.num_attention_heads *
                           static_cast<double>(dense.head_dim));

  const ModelArgs moe = test::tiny_moe();  // layer 0 sparse: 4 experts, 2 per token
  ParallelAxes ep;
  ep.ep_degree = 2;
  const ParallelizePlan experts_halved = parallelize_decoder(moe, ep);
  int64_t experts = 0;
  for (const ParamGroupSpec& g : model_param_specs(moe)) {
    for (const ParamSpec& p : g.params) experts += p.shape.size() == 3 ? shape_numel(p.shape) : 0;
  }
  EXPECT_GT(experts, 0);
  const ParamCounts moe_whole = count_parameters(moe),
                    moe_rank = count_parameters(moe, experts_halved);
  EXPECT_EQ(moe_rank.total, moe_whole.total - experts / 2);
  EXPECT_EQ(moe_rank.active, moe_whole.active);
  EXPECT_EQ(moe_whole.total - moe_whole.active, experts / 2);  // k = 2 of E = 4
  EXPECT_EQ(training_flops_per_token(moe, 64, experts_halved), training_flops_per_token(moe, 64));
}

// The part of a (d0, d1) or (d0, d1, d2) tensor whose elements are their own indices, cut by
// `cuts`, element by element: each part index mapped back through the cuts in reverse.
std::vector<float> reference_part(const Shape& whole, const std::vector<Shard>& cuts) {
  std::vector<Shape> extents = {whole};
  for (const Shard& c : cuts) {
    Shape next = extents.back();
    next[static_cast<size_t>(c.dim)] = c.per_shard(next[static_cast<size_t>(c.dim)]);
    extents.push_back(next);
  }
  const Shape& part = extents.back();
  std::vector<float> out(static_cast<size_t>(shape_numel(part)), 0.0f);
  std::vector<int64_t> index(part.size(), 0);
  for (int64_t i = 0; i < shape_numel(part); ++i) {
    int64_t rest = i;
    for (size_t d = part.size(); d-- > 0;) {
      index[d] = rest % part[d];
      rest /= part[d];
    }
    bool real = true;  // back through the cuts: each adds its offset, padding falls outside
    for (size_t k = cuts.size(); k-- > 0;) {
      const auto d = static_cast<size_t>(cuts[k].dim);
      index[d] += cuts[k].index * cuts[k].per_shard(extents[k][d]);
      real &= index[d] < extents[k][d];
    }
    for (size_t d = 0; d < whole.size(); ++d) real &= index[d] < whole[d];
    if (!real) continue;
    int64_t flat = 0;
    for (size_t d = 0; d < whole.size(); ++d) flat = flat * whole[d] + index[d];
    out[static_cast<size_t>(i)] = static_cast<float>(flat + 1);
  }
  return out;
}

TEST(ShardRuns, CutsAndCutsOfCutsHoldTheirElements) {
  const std::vector<std::pair<Shape, std::vector<Shard>>> cases = {
      {{6, 4}, {}},
      {{6, 4}, {{1, 2, 0}}},
      {{6, 4}, {{1, 2, 1}}},
      {{7, 4}, {{2, 3, 0}}},                // FSDP's padded last part
      {{8, 6}, {{1, 2, 1}, {1, 3, 0}}},     // row-wise TP, then FSDP rows
      {{8, 6}, {{0, 2, 0}, {2, 3, 0}}},     // column-wise TP, then FSDP rows (padded)
      {{3, 4, 6}, {{1, 2, 2}, {0, 2, 0}}},  // stacked experts
      {{5}, {{1, 2, 0}}},
  };
  for (const auto& [whole, cuts] : cases) {
    std::vector<float> values(static_cast<size_t>(shape_numel(whole)));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i + 1);
    const ShardBox box = shard_box(whole, cuts);
    std::vector<float> part(static_cast<size_t>(shape_numel(box.part)), -1.0f);
    copy_part_out(box, values.data(), part.data());
    EXPECT_EQ(part, reference_part(whole, cuts)) << shape_str(whole) << " " << cuts.size();
    std::vector<float> back(values.size(), 0.0f);
    copy_part_in(box, part.data(), back.data());
    for (size_t i = 0; i < back.size(); ++i) {
      EXPECT_TRUE(back[i] == 0.0f || back[i] == values[i]) << shape_str(whole) << " " << i;
    }
  }
}

TEST(ShardRuns, EachTpRankInitialisesItsCutOfTheWholeModel) {
  ModelArgs a = even_dense();  // a Llama with every bias: row-wise ones stay whole
  a.architecture = "LlamaForCausalLM";
  a.qk_norm = false;
  a.attention_bias = a.o_proj_bias = a.mlp_bias = true;
  const std::unique_ptr<CausalLM> whole = make_model(a);
  whole->initialize(7);
  for (int64_t rank = 0; rank < 2; ++rank) {
    const ParallelizePlan plan = parallelize_decoder(a, {rank, 2, 0, 1, false});
    const std::vector<ParamGroupSpec> specs = local_param_specs(a, plan);
    for (size_t g = 0; g < specs.size(); ++g) {
      ParamGroup local(specs[g].name, specs[g].params);
      initialize_local_group(local, a, 7, plan);
      const ParamGroup& w = whole->param_groups()[g];
      for (const ParamView& v : local.views()) {
        const ParamView& wv = w.view(v.spec.name);
        EXPECT_EQ(whole_param_spec(v.spec, plan).shape, wv.spec.shape) << v.spec.name;
        std::vector<float> expected(static_cast<size_t>(v.numel));
        copy_part_out(shard_box(wv.spec.shape, {plan.placement_of(v.spec)}), w.params() + wv.offset,
                      expected.data());
        EXPECT_EQ(
            std::vector<float>(local.params() + v.offset, local.params() + v.offset + v.numel),
            expected)
            << v.spec.name << " on rank " << rank;
      }
    }
  }
}

}  // namespace
}  // namespace titan
