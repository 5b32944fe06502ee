// The expert-parallel model's test case, shared by its ranks as threads
// (test_expert_parallel.cpp) and as MPI processes (test_expert_parallel_mpi.cpp): a tiny
// Qwen3-MoE, each rank's own tokens, two accumulated micro-batches of training, and the comparison
// of a rank's loss and gradients with the whole model's in one process.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tiny_models.h"
#include "titan/core/rng.h"
#include "titan/models/parallelize.h"
#include "titan/models/registry.h"
#include "titan/nn/shard.h"
#include "unit/compare.h"

namespace titan::test {

constexpr int64_t kBatch = 2, kSeq = 8, kMicroBatches = 2;
constexpr double kTolerance = 1e-5;

using Tensors = std::map<std::string, std::vector<float>>;

struct Step {
  double loss = 0.0;  // the micro-batches' loss sums and load-balancing losses
  double aux = 0.0;   // the load-balancing losses
  Tensors grads;
  int64_t exchanges = 0;  // all_to_all_v calls
};

// `experts` experts of width 16, `per_token` per token, every layer sparse, the aux loss on.
inline ModelArgs moe(int64_t experts, int64_t per_token) {
  ModelArgs a = test::with_moe(test::tiny_dense(false), experts, per_token, 16, {});
  a.output_router_logits = true;
  return a;
}

// The whole model's weights: its initialisation with every norm weight moved off its constant
// start. `to_first_two`: each layer's router scores expert 0 by a random direction and every other
// expert 0, so each token picks expert 0 or 1 (and with top-k 2, 0 and 1, or 1 and 2): the experts
// above 2 get no rows from any rank.
inline Tensors whole_weights(const ModelArgs& args, bool to_first_two = false) {
  const std::unique_ptr<CausalLM> m = make_model(args);
  m->initialize(3);
  Rng rng(11);
  Tensors weights;
  for (const ParamGroup& g : m->param_groups()) {
    for (const ParamView& v : g.views()) {
      std::vector<float> w(g.params() + v.offset, g.params() + v.offset + v.numel);
      if (v.spec.name.find("norm") != std::string::npos) {
        for (float& x : w) x += static_cast<float>((rng.uniform() - 0.5) * 0.4);
      }
      if (to_first_two && v.spec.name.ends_with("mlp.gate.weight")) {
        std::fill(w.begin() + args.hidden_size, w.end(), 0.0f);
      }
      weights.emplace(v.spec.name, std::move(w));
    }
  }
  return weights;
}

// The part `shard` of a tensor of `shape` (row-major), dim 0 only here (whole experts).
inline std::vector<float> cut(const std::vector<float>& whole, const Shape& shape,
                              const Shard& shard) {
  if (shard.count == 1) return whole;
  EXPECT_EQ(shard.dim, 0);
  const int64_t inner = static_cast<int64_t>(whole.size()) / shape[0];
  const int64_t first = shard.first(shape[0]), size = shard.size(shape[0]);
  return {whole.begin() + first * inner, whole.begin() + (first + size) * inner};
}

struct MicroBatch {
  std::vector<int32_t> inputs, labels;  // (kBatch * kSeq)
};

// Rank `rank`'s kMicroBatches micro-batches of kBatch rows of random tokens (some not scored).
inline std::vector<MicroBatch> rank_micro_batches(int64_t rank, int64_t vocab) {
  std::vector<MicroBatch> micro;
  Rng rng(5 + static_cast<uint64_t>(rank));
  for (int64_t i = 0; i < kMicroBatches; ++i) {
    std::vector<int32_t> ids(kBatch * kSeq + 1);
    for (int32_t& id : ids)
      id = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
    MicroBatch b{{ids.begin(), ids.end() - 1}, {ids.begin() + 1, ids.end()}};
    b.labels[3] = b.labels[kSeq + 5] = kIgnoreIndex;
    micro.push_back(std::move(b));
  }
  return micro;
}

// The accumulated micro-batches `micro` of `batch` rows each through `m`, loaded with `weights`
// cut by `plan`, each forward with `options` (compute_grad set).
inline Step train_step(CausalLM& m, const ParallelizePlan& plan, const Tensors& weights,
                       const std::vector<MicroBatch>& micro, int64_t batch,
                       const ForwardOptions& options) {
  for (ParamGroup& g : m.param_groups()) {
    for (const ParamView& v : g.views()) {
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
  for (const MicroBatch& b : micro) {
    step.loss += m.forward(b.inputs.data(), b.labels.data(), batch, kSeq, options).loss_sum;
    step.aux += m.aux_loss();
    step.loss += m.aux_loss();
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

// Two accumulated micro-batches of rank `rank`'s tokens (rank_micro_batches), each load-balancing
// loss counted whole (aux_loss_scale 1).
inline Step train_step(CausalLM& m, const ParallelizePlan& plan, const Tensors& weights,
                       int64_t rank, int64_t vocab) {
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / 28.0f;
  return train_step(m, plan, weights, rank_micro_batches(rank, vocab), kBatch, options);
}

inline ParallelizePlan ep_plan(const ModelArgs& args, int64_t rank, int64_t degree) {
  ParallelAxes axes;
  axes.ep_index = rank;
  axes.ep_degree = degree;
  return parallelize_decoder(args, axes);
}

// Rank `rank` of an EP group of `degree` left `got`; the whole model on that rank's tokens left
// `whole`, and `summed` is the sum over the ranks of the whole model's gradients: the loss equals
// whole's, each replicated parameter's gradient whole's, each expert gradient its slice of summed.
inline void expect_rank_equals_whole(const ModelArgs& args, int rank, int degree, const Step& got,
                                     const Step& whole, const Tensors& summed, double tolerance) {
  EXPECT_NEAR(got.loss, whole.loss, tolerance * std::abs(whole.loss)) << "rank " << rank;
  const ParallelizePlan plan = ep_plan(args, rank, degree);
  for (const ParamGroupSpec& g : model_param_specs(args)) {
    for (const ParamSpec& p : g.params) {
      const Shard placement = plan.placement_of(p);
      const std::vector<float> want = placement.count == 1
                                          ? whole.grads.at(p.name)
                                          : cut(summed.at(p.name), p.shape, placement);
      const std::vector<float>& have = got.grads.at(p.name);
      ASSERT_EQ(have.size(), want.size()) << p.name;
      testing::expect_close("rank " + std::to_string(rank) + " " + p.name, have.data(), want.data(),
                            static_cast<int64_t>(want.size()), tolerance);
    }
  }
}

}  // namespace titan::test
