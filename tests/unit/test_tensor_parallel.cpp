// Tensor parallel inside the model (DecoderLM on a plan that cuts its parameters over TP ranks,
// with and without sequence parallel): a group's ranks run as threads of this process
// (dispatch/thread_group.h), each model loaded with its cut of one whole model's weights
// (ParallelizePlan::placement_of), and two accumulated micro-batches of training compared with
// the whole model in one process -- the loss equal on every rank and to the whole model's within
// 1e-5 relative, each rank's gradients equal to its cut of the whole model's gradients, the
// replicated parameters' gradients the same bits on every rank. Models: a dense Qwen3 (q/k norms,
// whose gradients are summed over the group), a Llama with biases on every linear (the row-wise
// biases added once), a tied embedding (the lm_head is the embedding's rows), on 2 and 4 ranks;
// the same on 2 ranks in bf16 compute. Sequence parallel the same way, also under activation
// checkpointing, its arena's bytes per rank against one process's. One step counts the group's
// reductions and gathers. A model with experts: EP x TP (the TP ranks as the EP group) and expert
// tensor parallel (TP without EP: every expert cut along its width), each against the whole model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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
#include "titan/models/decoder_lm.h"
#include "titan/models/parallelize.h"
#include "titan/models/registry.h"
#include "titan/nn/shard.h"
#include "unit/compare.h"
#include "unit/thread_all_to_all.h"

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
Step train_step(CausalLM& m, const ParallelizePlan& plan, const Tensors& weights,
                const ActivationCheckpointing& checkpointing) {
  m.set_activation_checkpointing(checkpointing);
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

// `expert_parallel`: EP x TP with the TP group as the EP group (ep == tp, EP index = tp index).
ParallelizePlan tp_plan(const ModelArgs& args, int64_t rank, int64_t degree,
                        bool sequence_parallel = false, bool expert_parallel = false) {
  ParallelAxes axes;
  axes.tp_index = rank;
  axes.tp_degree = degree;
  axes.sequence_parallel = sequence_parallel;
  if (expert_parallel) {
    axes.ep_index = rank;
    axes.ep_degree = degree;
  }
  return parallelize_decoder(args, axes);
}

// How a group computes: its degree, sequence parallel or not, the dtype and checkpointing.
struct GroupRun {
  int degree = 2;
  bool sequence_parallel = false;
  bool expert_parallel = false;  // EP x TP: the experts whole over the TP ranks
  DType dtype = DType::f32;
  ActivationCheckpointing checkpointing;
};

// The reductions one rank's model called: (callback, count) -> calls.
using Calls = std::map<std::pair<std::string, int64_t>, int64_t>;

// The thread ranks' all-gather and reduce-scatter (LayerCollectives), made of their sum: a rank's
// blocks placed in zeros and summed over the group are every rank's blocks, exactly; the sum of
// every rank's partial blocks, taken at this rank's place, is the reduce-scatter (in rank order).
void all_gather_by_sum(const VocabShard& shard, int degree, int64_t rank, const float* in,
                       float* out, int64_t count, int64_t parts) {
  std::vector<float> whole(static_cast<size_t>(parts * degree * count), 0.0f);
  for (int64_t p = 0; p < parts; ++p) {
    std::copy(in + p * count, in + (p + 1) * count, whole.begin() + (p * degree + rank) * count);
  }
  shard.all_reduce_sum(whole.data(), static_cast<int64_t>(whole.size()));
  std::copy(whole.begin(), whole.end(), out);
}
void reduce_scatter_by_sum(const VocabShard& shard, int degree, int64_t rank, const float* in,
                           float* out, int64_t count, int64_t parts) {
  std::vector<float> sum(in, in + parts * degree * count);
  shard.all_reduce_sum(sum.data(), static_cast<int64_t>(sum.size()));
  for (int64_t p = 0; p < parts; ++p) {
    const auto at = sum.begin() + (p * degree + rank) * count;
    std::copy(at, at + count, out + p * count);
  }
}

// Every rank of a TP group as a thread, each running train_step on its cut; per rank its step and
// the collectives it called, and its arena's bytes.
void run_group(const ModelArgs& args, const Tensors& weights, const GroupRun& run,
               std::vector<Step>& steps, std::vector<Calls>& calls,
               std::vector<int64_t>* activation_bytes = nullptr) {
  const int degree = run.degree;
  steps.assign(static_cast<size_t>(degree), {});
  calls.assign(static_cast<size_t>(degree), {});
  if (activation_bytes != nullptr) activation_bytes->assign(static_cast<size_t>(degree), 0);
  test::ThreadAllToAll exchange(degree);
  run_vocab_ranks_in_threads(args.vocab_size, degree, [&](const VocabShard& shard) {
    const int64_t rank = shard.start / shard.rows;
    const ParallelizePlan plan =
        tp_plan(args, rank, degree, run.sequence_parallel, run.expert_parallel);
    const std::unique_ptr<CausalLM> m = make_model(args, {}, run.dtype, Residency::committed, plan);
    Calls& mine = calls[static_cast<size_t>(rank)];
    LayerCollectives collectives;
    collectives.sum_partials = [&](float* x, int64_t count) {
      ++mine[{"sum", count}];
      shard.all_reduce_sum(x, count);
    };
    collectives.all_reduce_max = [&](float* x, int64_t count) {
      ++mine[{"max", count}];
      shard.all_reduce_max(x, count);
    };
    collectives.sum_statistics = [&](double* x, int64_t count) {
      ++mine[{"statistics", count}];
      std::vector<float> narrow(x, x + count);  // counts exact; probability sums to 1e-7
      shard.all_reduce_sum(narrow.data(), count);
      std::copy(narrow.begin(), narrow.end(), x);
    };
    if (run.expert_parallel) {
      collectives.all_to_all_v = [&](const void* send, const std::vector<int64_t>& send_counts,
                                     void* recv, const std::vector<int64_t>& recv_counts,
                                     DType type) {
        ++mine[{"all_to_all_v", 0}];
        exchange.exchange(static_cast<int>(rank), send, send_counts, recv, recv_counts, type);
      };
    }
    if (run.sequence_parallel || run.expert_parallel) {
      collectives.all_gather = [&](const float* in, float* out, int64_t count, int64_t parts) {
        ++mine[{"gather", count * parts}];
        all_gather_by_sum(shard, degree, rank, in, out, count, parts);
      };
      collectives.reduce_scatter = [&](const float* in, float* out, int64_t count, int64_t parts) {
        ++mine[{"scatter", count * parts}];
        reduce_scatter_by_sum(shard, degree, rank, in, out, count, parts);
      };
    }
    m->set_layer_collectives(collectives);
    steps[static_cast<size_t>(rank)] = train_step(*m, plan, weights, run.checkpointing);
    if (activation_bytes != nullptr) {
      (*activation_bytes)[static_cast<size_t>(rank)] = m->activation_bytes(kBatch, kSeq);
    }
  });
}

void expect_group_equals_whole(const ModelArgs& args, const GroupRun& run,
                               double tolerance = kTolerance) {
  const int degree = run.degree;
  const DType dtype = run.dtype;
  const Tensors weights = whole_weights(args);
  const std::unique_ptr<CausalLM> whole_model = make_model(args, {}, dtype);
  const Step whole = train_step(*whole_model, ParallelizePlan(), weights, run.checkpointing);
  std::vector<Step> ranks;
  std::vector<Calls> calls;
  run_group(args, weights, run, ranks, calls);
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  for (int rank = 0; rank < degree; ++rank) {
    const Step& got = ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(got.loss, ranks[0].loss) << "rank " << rank;
    EXPECT_NEAR(got.loss, whole.loss, tolerance * std::abs(whole.loss)) << "rank " << rank;
    const ParallelizePlan plan =
        tp_plan(args, rank, degree, run.sequence_parallel, run.expert_parallel);
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

GroupRun on(int degree, bool sequence_parallel = false, DType dtype = DType::f32) {
  GroupRun run;
  run.degree = degree;
  run.sequence_parallel = sequence_parallel;
  run.dtype = dtype;
  return run;
}

TEST(TensorParallel, Qwen3WithQkNormsOnTwoAndFourRanksEqualsTheWholeModel) {
  expect_group_equals_whole(qwen3(), on(2));
  expect_group_equals_whole(even(test::tiny_dense(false), 4), on(4));
}

TEST(TensorParallel, LlamaWithBiasesAddsRowWiseBiasesOnce) {
  expect_group_equals_whole(llama_with_biases(), on(2));
  ModelArgs four = llama_with_biases();
  four.num_key_value_heads = 4;
  expect_group_equals_whole(four, on(4));
}

TEST(TensorParallel, TiedEmbeddingTakesBothGradientsInItsRows) {
  expect_group_equals_whole(tied(), on(2));
}

// Sequence parallel: the residual stream, the layer norms and the final norm on seq / tp tokens
// of each sequence (their weights' gradients summed over the group), the blocks' inputs gathered
// and outputs reduce-scattered.
TEST(SequenceParallel, Qwen3WithQkNormsOnTwoAndFourRanksEqualsTheWholeModel) {
  expect_group_equals_whole(qwen3(), on(2, true));
  expect_group_equals_whole(even(test::tiny_dense(false), 4), on(4, true));
}

TEST(SequenceParallel, LlamaWithBiasesOnTwoAndFourRanksEqualsTheWholeModel) {
  expect_group_equals_whole(llama_with_biases(), on(2, true));
  ModelArgs four = llama_with_biases();
  four.num_key_value_heads = 4;
  expect_group_equals_whole(four, on(4, true));
}

TEST(SequenceParallel, TiedEmbeddingEqualsTheWholeModel) {
  expect_group_equals_whole(tied(), on(2, true));
  expect_group_equals_whole(even(test::tiny_dense(true), 4), on(4, true));
}

// The backward's inputs made again: whole layers recomputed (collectives and all), or the norms
// remade from the residual stream on this rank's rows and gathered again.
TEST(SequenceParallel, UnderActivationCheckpointingEqualsTheWholeModel) {
  for (const ActivationCheckpointing& checkpointing :
       {ActivationCheckpointing::full(), ActivationCheckpointing::ops()}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + checkpointing.name());
      GroupRun run = on(2, true, dtype);
      run.checkpointing = checkpointing;
      expect_group_equals_whole(qwen3(), run,
                                dtype == DType::bf16 ? verify_checks::kBf16Tolerance : kTolerance);
    }
  }
}

TEST(SequenceParallel, Bf16ComputeEqualsTheWholeModelInBf16) {
  for (const ModelArgs& args : {qwen3(), llama_with_biases(), tied()}) {
    expect_group_equals_whole(args, on(2, true, DType::bf16), verify_checks::kBf16Tolerance);
  }
}

// bf16 compute: each rank's GEMMs read the same bf16 roundings of its parts as the whole model's,
// but partial sums in another order may round an intermediate to the neighbouring bf16 value:
// within the project's bf16 tolerance (dispatch/verify_checks.h), which order-one errors exceed.
TEST(TensorParallel, Bf16ComputeEqualsTheWholeModelInBf16) {
  for (const ModelArgs& args : {qwen3(), llama_with_biases(), tied()}) {
    expect_group_equals_whole(args, on(2, false, DType::bf16), verify_checks::kBf16Tolerance);
  }
}

// One step's reductions, per rank: the embedding's rows, each block's output forward and its
// input's gradient backward, the loss's d x (all n x h), each layer's two q/k norm gradients
// (head_dim), and the loss's max and two-value sum per chunk (one chunk of 16 tokens here).
TEST(TensorParallel, OneStepReducesAtEachBoundaryOnceEachWay) {
  const ModelArgs args = qwen3();
  std::vector<Step> ranks;
  std::vector<Calls> calls;
  run_group(args, whole_weights(args), on(2), ranks, calls);
  const int64_t n = kBatch * kSeq, L = args.num_hidden_layers;
  const Calls want = {
      {{"sum", n * args.hidden_size}, kMicroBatches * (1 + 2 * L + 1 + 2 * L)},
      {{"sum", args.head_dim}, kMicroBatches * 2 * L},
      {{"max", n}, kMicroBatches},
      {{"sum", 2 * n}, kMicroBatches},
  };
  for (const Calls& c : calls) EXPECT_EQ(c, want);
}

// Sequence parallel's step, per rank: forward, the embedding's rows reduce-scattered, each
// block's input gathered and output reduce-scattered, the final norm gathered for the loss and
// the loss's d x reduce-scattered; backward, each block's input gathered again (only this rank's
// rows are kept) and its output's gradient gathered, its input's gradient reduce-scattered, the
// embedding's output gradient gathered. Each moves seq / tp tokens of every sequence per rank;
// nothing is summed whole any more but the norms' gradients: q/k (head_dim), each layer's two
// and the final norm (hidden).
TEST(SequenceParallel, OneStepGathersBeforeAndScattersAfterEachBlock) {
  const ModelArgs args = qwen3();
  std::vector<Step> ranks;
  std::vector<Calls> calls;
  run_group(args, whole_weights(args), on(2, true), ranks, calls);
  const int64_t n = kBatch * kSeq, L = args.num_hidden_layers, h = args.hidden_size;
  const int64_t rows = n / 2 * h;
  // (Added up: the loss's two-value sums may have the norms' count.)
  Calls want;
  want[{"gather", rows}] += kMicroBatches * ((2 * L + 1) + (4 * L + 1));
  want[{"scatter", rows}] += kMicroBatches * ((1 + 2 * L + 1) + 2 * L);
  want[{"sum", args.head_dim}] += kMicroBatches * 2 * L;
  want[{"sum", h}] += kMicroBatches * (2 * L + 1);
  want[{"max", n}] += kMicroBatches;
  want[{"sum", 2 * n}] += kMicroBatches;
  for (const Calls& c : calls) EXPECT_EQ(c, want);
}

// The arena a rank carves is what activation_bytes_of gives for its degree (titan plan's
// figure), the residual stream and norms at seq / tp tokens: printed against one process's.
TEST(SequenceParallel, ArenaBytesPerRankAreActivationBytesOf) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const int degree : {2, 4}) {
      const ModelArgs args = even(test::tiny_dense(false), degree);
      std::vector<Step> ranks;
      std::vector<Calls> calls;
      std::vector<int64_t> bytes;
      run_group(args, whole_weights(args), on(degree, true, dtype), ranks, calls, &bytes);
      const ActivationCheckpointing none = ActivationCheckpointing::none();
      const int64_t planned = DecoderLM::activation_bytes_of(
          args, dtype, none, kBatch, kSeq, {.tp_degree = degree, .sequence_parallel = true});
      const int64_t one = DecoderLM::activation_bytes_of(args, dtype, none, kBatch, kSeq);
      for (const int64_t b : bytes) EXPECT_EQ(b, planned);
      std::printf("%s TP %d with SP: activation bytes per rank %lld, one process %lld (%.3f)\n",
                  std::string(dtype_name(dtype)).c_str(), degree, static_cast<long long>(planned),
                  static_cast<long long>(one),
                  static_cast<double>(planned) / static_cast<double>(one));
    }
  }
}

// The bar on bench_train_step's `small` dims (h 512, 8 layers, 8/4 heads of 128, I 2048,
// vocabulary 151936 tied; 4 x 512 tokens): under TP 2 with sequence parallel a rank's activation
// bytes within 5 % of half of one process's -- without activation checkpointing (the benchmark's
// step) and under selective op, in fp32 and bf16 -- and its parameter bytes within 5 % of half.
// Full checkpointing keeps little per layer, so the scratch every layer shares, whose blocks see
// whole sequences ((N, h) gathered inputs, partial outputs and input gradients), weighs more:
// printed, not held to the bar.
TEST(SequenceParallel, SmallDimsHalveActivationAndParameterBytesOnTwoRanks) {
  ModelArgs a;  // Qwen3: q/k norms
  a.vocab_size = 151936;
  a.head_dim = 128;
  a.tie_word_embeddings = true;
  a.hidden_size = 512, a.intermediate_size = 2048, a.num_hidden_layers = 8;
  a.num_attention_heads = 8, a.num_key_value_heads = 4;
  constexpr int64_t batch = 4, seq = 512;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const ActivationCheckpointing& c :
         {ActivationCheckpointing::none(), ActivationCheckpointing::ops(),
          ActivationCheckpointing::full()}) {
      const int64_t one = DecoderLM::activation_bytes_of(a, dtype, c, batch, seq);
      const int64_t tp = DecoderLM::activation_bytes_of(a, dtype, c, batch, seq, {.tp_degree = 2});
      const int64_t sp = DecoderLM::activation_bytes_of(
          a, dtype, c, batch, seq, {.tp_degree = 2, .sequence_parallel = true});
      const double of_half = 2.0 * static_cast<double>(sp) / static_cast<double>(one);
      std::printf(
          "small %s, checkpointing %s: activation bytes one process %lld, TP 2 %lld, "
          "TP 2 with SP %lld = %.4f x half\n",
          std::string(dtype_name(dtype)).c_str(), c.name().c_str(), static_cast<long long>(one),
          static_cast<long long>(tp), static_cast<long long>(sp), of_half);
      if (!c.recomputes_layer(0)) {
        EXPECT_LE(of_half, 1.05) << dtype_name(dtype) << " " << c.name();
      }
    }
  }
  int64_t whole = 0;
  std::vector<int64_t> local(2, 0);
  for (const ParamGroupSpec& g : model_param_specs(a)) whole += param_group_numel(g.params);
  for (int64_t rank = 0; rank < 2; ++rank) {
    for (const ParamGroupSpec& g : local_param_specs(a, tp_plan(a, rank, 2, true))) {
      local[static_cast<size_t>(rank)] += param_group_numel(g.params);
    }
  }
  EXPECT_EQ(local[0], local[1]);
  const double of_half = 2.0 * static_cast<double>(local[0]) / static_cast<double>(whole);
  std::printf("small: parameter bytes one process %lld, TP 2 per rank %lld = %.4f x half\n",
              static_cast<long long>(whole * 4), static_cast<long long>(local[0] * 4), of_half);
  EXPECT_LE(of_half, 1.05);
}

// EP x TP (the TP ranks as the EP group, each holding whole experts): a sparse block runs on each
// rank's sequence shard -- its rows under sequence parallel, else sliced from the whole input and
// its output all-gathered --, its router's gradient and the load-balancing statistics summed over
// the group; the step equals the whole model's, every parameter's gradient its cut of the whole's.
TEST(ExpertTensorParallel, SparseBlocksOnSequenceShardsEqualTheWholeModel) {
  ModelArgs moe = test::with_moe(qwen3(), 4, 2, 16, {1});
  moe.output_router_logits = true;
  for (const bool sequence_parallel : {true, false}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "without sequence parallel");
    GroupRun run = on(2, sequence_parallel);
    run.expert_parallel = true;
    expect_group_equals_whole(moe, run);
    run.checkpointing = ActivationCheckpointing::full();
    expect_group_equals_whole(moe, run);
    run.checkpointing = ActivationCheckpointing::none();
    run.dtype = DType::bf16;
    expect_group_equals_whole(moe, run, verify_checks::kBf16Tolerance);
  }
}

// Expert tensor parallel (TP without EP, torchtitan's): every rank holds its part of each
// expert's width (gate and up column-wise, down row-wise) and runs the sparse block on the whole
// rows as a dense TP MLP runs -- its input gathered under sequence parallel, its output a partial
// sum reduce-scattered or all-reduced. The router's gradient is partial (the expert outputs it
// multiplies are) and summed over the group; the load-balancing statistics are the whole rows' on
// every rank, never summed over it, and the loss's gradient joins the group's sums once (a large
// coefficient, so that a gradient joined on every rank shows). On 2 and 4 ranks, with and
// without sequence parallel, under full activation checkpointing and in bf16.
TEST(ExpertTensorParallel, ExpertsCutAlongTheirWidthEqualTheWholeModel) {
  for (const int degree : {2, 4}) {
    ModelArgs moe = test::with_moe(even(test::tiny_dense(false), degree), 4, 2, 16, {1});
    moe.output_router_logits = true;
    moe.router_aux_loss_coef = 0.5;
    for (const bool sequence_parallel : {true, false}) {
      SCOPED_TRACE(std::to_string(degree) + (sequence_parallel ? " ranks, sequence parallel"
                                                               : " ranks, no sequence parallel"));
      GroupRun run = on(degree, sequence_parallel);
      expect_group_equals_whole(moe, run);
      std::vector<Step> ranks;
      std::vector<Calls> calls;
      run_group(moe, whole_weights(moe), run, ranks, calls);
      for (const Calls& c : calls) {
        for (const auto& [call, count] : c) EXPECT_NE(call.first, "statistics");
      }
      if (degree == 4) continue;
      run.checkpointing = ActivationCheckpointing::full();
      expect_group_equals_whole(moe, run);
      run.checkpointing = ActivationCheckpointing::none();
      run.dtype = DType::bf16;
      expect_group_equals_whole(moe, run, verify_checks::kBf16Tolerance);
    }
  }
}

// What is not built is refused with one line: a group's reductions not set, its gathers not set
// under sequence parallel, a sequence the degree does not divide.
TEST(TensorParallel, RefusesWhatIsNotBuilt) {
  const ModelArgs args = qwen3();
  const std::vector<int32_t> ids(8, 1);
  ForwardOptions options;
  const auto forward_error = [&](const ModelArgs& a, const ParallelizePlan& plan,
                                 const LayerCollectives& collectives, int64_t seq) {
    const std::unique_ptr<CausalLM> m = make_model(a, {}, DType::f32, Residency::committed, plan);
    m->set_layer_collectives(collectives);
    return test::error_of([&] { m->forward(ids.data(), ids.data(), 1, seq, options); });
  };
  EXPECT_NE(forward_error(args, tp_plan(args, 0, 2), {}, 8).find("reductions are not set"),
            std::string::npos);
  const auto nothing = [](float*, int64_t) {};
  LayerCollectives sums_only;
  sums_only.sum_partials = sums_only.all_reduce_max = nothing;
  EXPECT_NE(forward_error(args, tp_plan(args, 0, 2, true), sums_only, 8)
                .find("all_gather and reduce_scatter are not set"),
            std::string::npos);
  LayerCollectives all = sums_only;
  all.all_gather = all.reduce_scatter = [](const float*, float*, int64_t, int64_t) {};
  EXPECT_EQ(forward_error(args, tp_plan(args, 0, 2, true), all, 7),
            "training.seq_len 7 must be divisible by parallelism.tensor_parallel_degree 2 "
            "(sequence parallel gives each rank seq / degree tokens of every sequence)");
  EXPECT_EQ(test::error_of([&] {
              DecoderLM::activation_bytes_of(args, DType::f32, ActivationCheckpointing::none(), 1,
                                             6, {.tp_degree = 4, .sequence_parallel = true});
            }),
            "training.seq_len 6 must be divisible by parallelism.tensor_parallel_degree 4 "
            "(sequence parallel gives each rank seq / degree tokens of every sequence)");
}

}  // namespace
}  // namespace titan
