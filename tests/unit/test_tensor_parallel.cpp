// Tensor parallel inside the model (DecoderLM on a plan that cuts its parameters over TP ranks,
// without sequence parallel): a group's ranks run as threads of this process
// (dispatch/thread_group.h), each model loaded with its cut of one whole model's weights
// (ParallelizePlan::placement_of), and two accumulated micro-batches of training compared with
// the whole model in one process -- the loss equal on every rank and to the whole model's within
// 1e-5 relative, each rank's gradients equal to its cut of the whole model's gradients, the
// replicated parameters' gradients the same bits on every rank. Models: a dense Qwen3 (q/k norms,
// whose gradients are summed over the group), a Llama with biases on every linear (the row-wise
// biases added once), a tied embedding (the lm_head is the embedding's rows), on 2 and 4 ranks;
// the same on 2 ranks in bf16 compute. One step counts the group's reductions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "error_of.h"
#include "tiny_models.h"
#include "titan/core/rng.h"
#include "titan/dispatch/thread_group.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/models/parallelize.h"
#include "titan/models/registry.h"
#include "titan/nn/shard.h"
#include "unit/compare.h"

namespace titan {
namespace {

constexpr int64_t kBatch = 2, kSeq = 8, kMicroBatches = 2;
constexpr double kTolerance = 1e-5;

// tiny_dense with a vocabulary 2 and 4 ranks split evenly, key/value heads as given.
ModelArgs even(ModelArgs a, int64_t kv_heads = 2) {
  a.vocab_size = 96;
  a.num_key_value_heads = kv_heads;
  return a;
}
ModelArgs qwen3() {
  return even(test::tiny_dense(false));
}
ModelArgs llama_with_biases() {
  ModelArgs a = even(test::tiny_dense(false));
  a.architecture = "LlamaForCausalLM";
  a.qk_norm = false;
  a.attention_bias = a.o_proj_bias = a.mlp_bias = true;
  return a;
}
ModelArgs tied() {
  return even(test::tiny_dense(true));
}

using Tensors = std::map<std::string, std::vector<float>>;

// What a training step left: the loss sum of its micro-batches and every parameter's gradient.
struct Step {
  double loss = 0.0;
  Tensors grads;
};

// The whole model's weights: its initialisation with every norm weight and bias moved off its
// constant start (so a bias added twice, or a norm gradient not summed, shows). The biases stay
// small beside the tokens' embeddings: a residual stream dominated by the biases, the same for
// every token, would leave attention uniform and the q and k gradients fp32 rounding noise.
Tensors whole_weights(const ModelArgs& args) {
  const std::unique_ptr<CausalLM> m = make_model(args);
  m->initialize(3);
  Rng rng(11);
  Tensors weights;
  for (const ParamGroup& g : m->param_groups()) {
    for (const ParamView& v : g.views()) {
      std::vector<float> w(g.params() + v.offset, g.params() + v.offset + v.numel);
      const bool norm = v.spec.name.find("norm") != std::string::npos;
      const bool bias = v.spec.name.find("bias") != std::string::npos;
      const double spread = norm ? 0.4 : bias ? 0.04 : 0.0;
      for (float& x : w) x += static_cast<float>((rng.uniform() - 0.5) * spread);
      weights.emplace(v.spec.name, std::move(w));
    }
  }
  return weights;
}

// The part `shard` of a tensor of `shape` (row-major).
std::vector<float> cut(const std::vector<float>& whole, const Shape& shape, const Shard& shard) {
  if (shard.count == 1) return whole;
  int64_t outer = 1, inner = 1;
  const auto dim = static_cast<size_t>(shard.dim);
  for (size_t i = 0; i < dim; ++i) outer *= shape[i];
  for (size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t d = shape[dim], first = shard.first(d), size = shard.size(d);
  std::vector<float> part;
  for (int64_t o = 0; o < outer; ++o) {
    const float* row = whole.data() + (o * d + first) * inner;
    part.insert(part.end(), row, row + size * inner);
  }
  return part;
}

// Two accumulated micro-batches of random tokens (some not scored) through `m`, loaded with
// `weights` cut by `plan`.
Step train_step(CausalLM& m, const ParallelizePlan& plan, const Tensors& weights) {
  for (ParamGroup& g : m.param_groups()) {
    for (const ParamView& v : g.views()) {
      // The whole shape: the local one with the cut dimension whole.
      const Shard placement = plan.placement_of(v.spec);
      Shape whole = v.spec.shape;
      whole[static_cast<size_t>(placement.dim)] *= placement.count;
      const std::vector<float> part = cut(weights.at(v.spec.name), whole, placement);
      EXPECT_EQ(static_cast<int64_t>(part.size()), v.numel) << v.spec.name;
      std::copy(part.begin(), part.end(), g.params() + v.offset);
    }
  }
  m.allocate_gradients();
  m.zero_gradients();
  Step step;
  Rng rng(5);
  for (int64_t micro = 0; micro < kMicroBatches; ++micro) {
    std::vector<int32_t> ids(kBatch * kSeq + 1);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.next_u64() % 96);
    std::vector<int32_t> inputs(ids.begin(), ids.end() - 1), labels(ids.begin() + 1, ids.end());
    labels[3] = labels[kSeq + 5] = kIgnoreIndex;
    ForwardOptions options;
    options.compute_grad = true;
    options.grad_scale = 1.0f / 28.0f;
    step.loss += m.forward(inputs.data(), labels.data(), kBatch, kSeq, options).loss_sum;
    m.backward();
  }
  for (const ParamGroup& g : m.param_groups()) {
    for (const ParamView& v : g.views()) {
      step.grads.emplace(v.spec.name,
                         std::vector<float>(g.grads() + v.offset, g.grads() + v.offset + v.numel));
    }
  }
  return step;
}

ParallelizePlan tp_plan(const ModelArgs& args, int64_t rank, int64_t degree) {
  ParallelAxes axes;
  axes.tp_index = rank;
  axes.tp_degree = degree;
  return parallelize_decoder(args, axes);
}

// The reductions one rank's model called: (callback, count) -> calls.
using Calls = std::map<std::pair<std::string, int64_t>, int64_t>;

// Every rank of a TP group of `degree` as a thread, each running train_step on its cut; per rank
// its step and the reductions it called.
void run_group(const ModelArgs& args, const Tensors& weights, int degree, std::vector<Step>& steps,
               std::vector<Calls>& calls, DType dtype = DType::f32) {
  steps.assign(static_cast<size_t>(degree), {});
  calls.assign(static_cast<size_t>(degree), {});
  run_vocab_ranks_in_threads(args.vocab_size, degree, [&](const VocabShard& shard) {
    const int64_t rank = shard.start / shard.rows;
    const ParallelizePlan plan = tp_plan(args, rank, degree);
    const std::unique_ptr<CausalLM> m = make_model(args, {}, dtype, Residency::committed, plan);
    Calls& mine = calls[static_cast<size_t>(rank)];
    m->set_layer_collectives({[&](float* x, int64_t count) {
                                ++mine[{"sum", count}];
                                shard.all_reduce_sum(x, count);
                              },
                              [&](float* x, int64_t count) {
                                ++mine[{"max", count}];
                                shard.all_reduce_max(x, count);
                              },
                              {}});
    steps[static_cast<size_t>(rank)] = train_step(*m, plan, weights);
  });
}

void expect_group_equals_whole(const ModelArgs& args, int degree, DType dtype = DType::f32,
                               double tolerance = kTolerance) {
  const Tensors weights = whole_weights(args);
  const std::unique_ptr<CausalLM> whole_model = make_model(args, {}, dtype);
  const Step whole = train_step(*whole_model, ParallelizePlan(), weights);
  std::vector<Step> ranks;
  std::vector<Calls> calls;
  run_group(args, weights, degree, ranks, calls, dtype);
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  for (int rank = 0; rank < degree; ++rank) {
    const Step& got = ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(got.loss, ranks[0].loss) << "rank " << rank;
    EXPECT_NEAR(got.loss, whole.loss, tolerance * std::abs(whole.loss)) << "rank " << rank;
    const ParallelizePlan plan = tp_plan(args, rank, degree);
    for (const ParamGroupSpec& g : specs) {
      for (const ParamSpec& p : g.params) {
        const Shard placement = plan.placement_of(p);
        const std::vector<float> want = cut(whole.grads.at(p.name), p.shape, placement);
        const std::vector<float>& have = got.grads.at(p.name);
        ASSERT_EQ(have.size(), want.size()) << p.name;
        testing::expect_close("rank " + std::to_string(rank) + " " + p.name, have.data(),
                              want.data(), static_cast<int64_t>(want.size()), tolerance);
        if (placement.count == 1) {
          EXPECT_EQ(have, ranks[0].grads.at(p.name))
              << p.name << " is replicated: its gradient must be the same on every rank";
        }
      }
    }
  }
}

TEST(TensorParallel, Qwen3WithQkNormsOnTwoAndFourRanksEqualsTheWholeModel) {
  expect_group_equals_whole(qwen3(), 2);
  expect_group_equals_whole(even(test::tiny_dense(false), 4), 4);
}

TEST(TensorParallel, LlamaWithBiasesAddsRowWiseBiasesOnce) {
  expect_group_equals_whole(llama_with_biases(), 2);
  ModelArgs four = llama_with_biases();
  four.num_key_value_heads = 4;
  expect_group_equals_whole(four, 4);
}

TEST(TensorParallel, TiedEmbeddingTakesBothGradientsInItsRows) {
  expect_group_equals_whole(tied(), 2);
}

// bf16 compute: each rank's GEMMs read the same bf16 roundings of its parts as the whole model's,
// but partial sums in another order may round an intermediate to the neighbouring bf16 value:
// within the project's bf16 tolerance (dispatch/verify_checks.h), which order-one errors exceed.
TEST(TensorParallel, Bf16ComputeEqualsTheWholeModelInBf16) {
  expect_group_equals_whole(qwen3(), 2, DType::bf16, verify_checks::kBf16Tolerance);
  expect_group_equals_whole(llama_with_biases(), 2, DType::bf16, verify_checks::kBf16Tolerance);
  expect_group_equals_whole(tied(), 2, DType::bf16, verify_checks::kBf16Tolerance);
}

// One step's reductions, per rank: the embedding's rows, each block's output forward and its
// input's gradient backward, the loss's d x (all n x h), each layer's two q/k norm gradients
// (head_dim), and the loss's max and two-value sum per chunk (one chunk of 16 tokens here).
TEST(TensorParallel, OneStepReducesAtEachBoundaryOnceEachWay) {
  const ModelArgs args = qwen3();
  std::vector<Step> ranks;
  std::vector<Calls> calls;
  run_group(args, whole_weights(args), 2, ranks, calls);
  const int64_t n = kBatch * kSeq, L = args.num_hidden_layers;
  const Calls want = {
      {{"sum", n * args.hidden_size}, kMicroBatches * (1 + 2 * L + 1 + 2 * L)},
      {{"sum", args.head_dim}, kMicroBatches * 2 * L},
      {{"max", n}, kMicroBatches},
      {{"sum", 2 * n}, kMicroBatches},
  };
  for (const Calls& c : calls) EXPECT_EQ(c, want);
}

// What is not built is refused with one line: a group's reductions not set, sequence parallel,
// experts under tensor parallel.
TEST(TensorParallel, RefusesWhatIsNotBuilt) {
  const ModelArgs args = qwen3();
  const std::vector<int32_t> ids(8, 1);
  ForwardOptions options;
  const auto forward_error = [&](const ModelArgs& a, const ParallelizePlan& plan) {
    const std::unique_ptr<CausalLM> m = make_model(a, {}, DType::f32, Residency::committed, plan);
    return test::error_of([&] { m->forward(ids.data(), ids.data(), 1, 8, options); });
  };
  EXPECT_NE(forward_error(args, tp_plan(args, 0, 2)).find("reductions are not set"),
            std::string::npos);
  ParallelAxes sp;
  sp.tp_degree = 2;
  sp.sequence_parallel = true;
  EXPECT_NE(forward_error(args, parallelize_decoder(args, sp)).find("sequence parallel"),
            std::string::npos);
  ModelArgs moe = test::with_moe(qwen3(), 4, 2, 16, {1});
  EXPECT_NE(forward_error(moe, tp_plan(moe, 1, 2)).find("experts is not built"), std::string::npos);
}

}  // namespace
}  // namespace titan
