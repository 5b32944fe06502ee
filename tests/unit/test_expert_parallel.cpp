// Expert parallel inside the model (DecoderLM on a plan that cuts the experts over EP ranks,
// torchtitan's meaning: every EP rank is a data-parallel rank with its own tokens): a group's
// ranks run as threads of this process, their all-to-all-v meeting behind a barrier, each model
// loaded with its experts of one whole model's weights, and two accumulated micro-batches of
// training compared with the whole model in one process run on each rank's tokens: each rank's
// loss equals the whole model's on that rank's tokens within 1e-5 relative, each rank's expert
// gradients equal its experts' slice of the sum over ranks of the whole model's expert gradients
// (an expert's gradient accumulates on its owner from every rank's tokens), and the replicated
// parameters' gradients (router included) equal the whole model's on the rank's tokens. Qwen3-MoE
// with every layer sparse, top-k 1 and 2, EP 2 and 4, fp32 and bf16 compute, the load-balancing
// loss on; a router that sends every token to the first two experts (a rank receiving no rows, one
// receiving every row: the model drops none); and what is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "error_of.h"
#include "expert_parallel_case.h"
#include "titan/core/error.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/models/activation_checkpointing.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/parallelize.h"
#include "titan/models/registry.h"
#include "titan/nn/expert_parallel.h"
#include "unit/thread_all_to_all.h"

namespace titan {
namespace {

using test::ep_plan;
using test::expect_rank_equals_whole;
using test::kMicroBatches;
using test::kTolerance;
using test::moe;
using test::Step;
using test::Tensors;
using test::train_step;
using test::whole_weights;

// Every rank of an EP group of `degree` as a thread, each running train_step on its experts and
// its own tokens.
std::vector<Step> run_group(
    const ModelArgs& args, const Tensors& weights, int degree, DType dtype,
    ActivationCheckpointing checkpointing = ActivationCheckpointing::none()) {
  std::vector<Step> steps(static_cast<size_t>(degree));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(degree));
  test::ThreadAllToAll group(degree);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < degree; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const ParallelizePlan plan = ep_plan(args, rank, degree);
        const std::unique_ptr<CausalLM> m = make_model(args, {}, dtype, Residency::committed, plan);
        int64_t exchanges = 0;
        LayerCollectives collectives;
        collectives.all_to_all_v = [&](const void* send, const std::vector<int64_t>& send_counts,
                                       void* recv, const std::vector<int64_t>& recv_counts,
                                       DType type) {
          ++exchanges;
          group.exchange(rank, send, send_counts, recv, recv_counts, type);
        };
        m->set_layer_collectives(collectives);
        m->set_activation_checkpointing(checkpointing);
        Step& step = steps[static_cast<size_t>(rank)];
        step = train_step(*m, plan, weights, rank, args.vocab_size);
        step.exchanges = exchanges;
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
        group.leave(rank);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return steps;
}

void expect_group_equals_whole(
    const ModelArgs& args, int degree, DType dtype = DType::f32, double tolerance = kTolerance,
    bool to_first_two = false,
    ActivationCheckpointing checkpointing = ActivationCheckpointing::none()) {
  SCOPED_TRACE("ep " + std::to_string(degree) + ", top-k " +
               std::to_string(args.num_experts_per_tok) + ", " + std::string(dtype_name(dtype)));
  const Tensors weights = whole_weights(args, to_first_two);
  // The whole model on each rank's tokens, and its expert gradients summed over the ranks.
  std::vector<Step> whole;
  Tensors summed;
  for (int rank = 0; rank < degree; ++rank) {
    const std::unique_ptr<CausalLM> m = make_model(args, {}, dtype);
    whole.push_back(train_step(*m, ParallelizePlan(), weights, rank, args.vocab_size));
    for (const auto& [name, grad] : whole.back().grads) {
      std::vector<float>& sum = summed[name];
      sum.resize(grad.size(), 0.0f);
      for (size_t i = 0; i < grad.size(); ++i) sum[i] += grad[i];
    }
  }
  if (to_first_two) {
    // The case holds: experts above k got no rows from any rank, expert 0 some.
    for (const auto& [name, grad] : summed) {
      if (name.find("mlp.experts.") == std::string::npos) continue;
      const size_t per_expert = grad.size() / static_cast<size_t>(args.num_experts);
      const auto rows_of = [&](int64_t e) {
        return std::span<const float>(grad).subspan(static_cast<size_t>(e) * per_expert,
                                                    per_expert);
      };
      const auto nonzero = [](float g) { return g != 0.0f; };
      EXPECT_TRUE(std::ranges::any_of(rows_of(0), nonzero)) << name;
      for (int64_t e = args.num_experts_per_tok + 1; e < args.num_experts; ++e) {
        EXPECT_TRUE(std::ranges::none_of(rows_of(e), nonzero)) << name << " expert " << e;
      }
    }
  }
  const std::vector<Step> ranks = run_group(args, weights, degree, dtype, checkpointing);
  for (int rank = 0; rank < degree; ++rank) {
    expect_rank_equals_whole(args, rank, degree, ranks[static_cast<size_t>(rank)],
                             whole[static_cast<size_t>(rank)], summed, tolerance);
  }
}

TEST(ExpertParallel, TopOneAndTwoOnTwoAndFourRanksEqualTheWholeModel) {
  expect_group_equals_whole(moe(4, 1), 2);
  expect_group_equals_whole(moe(4, 2), 2);
  expect_group_equals_whole(moe(8, 2), 4);
  expect_group_equals_whole(moe(4, 1), 4);
}

// bf16 compute: the experts' GEMMs read the same bf16 roundings of the same rows, but in other
// groupings, so an output may round to the neighbouring bf16 value: within the project's bf16
// tolerance (dispatch/verify_checks.h).
TEST(ExpertParallel, Bf16ComputeEqualsTheWholeModelInBf16) {
  expect_group_equals_whole(moe(4, 2), 2, DType::bf16, verify_checks::kBf16Tolerance);
  expect_group_equals_whole(moe(8, 1), 4, DType::bf16, verify_checks::kBf16Tolerance);
}

// Every token routed among the first experts: with top-k 1 experts 0 and 1 get every row, so on
// EP 2 rank 1 receives none and rank 0 every rank's; on EP 4 ranks 1 to 3 receive none (top-k 2:
// rank 1 receives expert 2's). The model has no capacity limit: nothing is dropped.
TEST(ExpertParallel, RanksReceivingNoRowsOrEveryRowEqualTheWholeModel) {
  expect_group_equals_whole(moe(4, 1), 2, DType::f32, kTolerance, true);
  expect_group_equals_whole(moe(4, 2), 2, DType::f32, kTolerance, true);
  expect_group_equals_whole(moe(8, 1), 4, DType::f32, kTolerance, true);
  expect_group_equals_whole(moe(8, 2), 4, DType::bf16, verify_checks::kBf16Tolerance, true);
}

// The most rows that can arrive at a rank: every rank's tokens each choosing min(k, E / ep) of
// its experts (the routing above reaches it: on EP 2 with top-k 1 rank 0 receives every row).
// The arena holds the rooms for them after the layers' activations, in fp32: the arrived rows'
// inputs, outputs and the exchange's staging (h wide), the grouped kernel's act, dgate, dup and
// dact (Im wide), each row's weight and its gradient, and per activation set the kept gate and
// up; titan plan's figure (activation_bytes_of) is the model's.
TEST(ExpertParallel, TheArenaHoldsRoomForTheMostRowsThatCanArrive) {
  EXPECT_EQ(most_arrived_rows(16, 1, 4, 2), 2 * 16);
  EXPECT_EQ(most_arrived_rows(16, 2, 4, 2), 2 * 16 * 2);
  EXPECT_EQ(most_arrived_rows(16, 4, 8, 4), 4 * 16 * 2);  // k above a rank's E / ep
  const ModelArgs args = moe(4, 2);
  const int64_t batch = 2, seq = 8, rows = 2 * batch * seq * 2;
  const auto words = [](int64_t floats) { return (floats + 15) / 16 * 16; };  // 64-byte views
  int64_t sparse = 0;
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) sparse += args.layer_is_sparse(i);
  ASSERT_GT(sparse, 0);
  const int64_t h = args.hidden_size, Im = args.moe_intermediate_size;
  const int64_t rooms =
      3 * words(rows * h) + 4 * words(rows * Im) + 2 * words(rows) + sparse * 2 * words(rows * Im);
  const ActivationCheckpointing none = ActivationCheckpointing::none();
  const int64_t planned =
      DecoderLM::activation_bytes_of(args, DType::f32, none, batch, seq, {.ep_degree = 2});
  EXPECT_EQ(planned - DecoderLM::activation_bytes_of(args, DType::f32, none, batch, seq),
            rooms * static_cast<int64_t>(sizeof(float)));
  const std::unique_ptr<CausalLM> m =
      make_model(args, {}, DType::f32, Residency::committed, ep_plan(args, 0, 2));
  EXPECT_EQ(m->activation_bytes(batch, seq), planned);
}

// Per sparse layer and micro-batch: the counts, the rows there and the outputs back in the
// forward; dy rows, weights and the inputs there, dx rows and d weights back in the backward.
TEST(ExpertParallel, EachLayerExchangesThreeTimesForwardAndFiveTimesBackward) {
  const ModelArgs args = moe(4, 2);
  const std::vector<Step> ranks = run_group(args, whole_weights(args), 2, DType::f32);
  for (const Step& s : ranks) {
    EXPECT_EQ(s.exchanges, kMicroBatches * args.num_hidden_layers * (3 + 5));
  }
}

// Activation checkpointing: a recomputed layer exchanges its rows again in its backward, and
// layers sharing one activation set share what it keeps of the arrived rows (full: both layers;
// selective "2": layer 1 only).
TEST(ExpertParallel, RecomputedLayersExchangeAgainAndEqualTheWholeModel) {
  const ModelArgs args = moe(4, 2);
  for (const ActivationCheckpointing& ac :
       {ActivationCheckpointing::full(), ActivationCheckpointing::every_nth_layer(2)}) {
    SCOPED_TRACE(ac.name());
    expect_group_equals_whole(args, 2, DType::f32, kTolerance, false, ac);
    const std::vector<Step> ranks = run_group(args, whole_weights(args), 2, DType::f32, ac);
    int64_t recomputed = 0;
    for (int64_t i = 0; i < args.num_hidden_layers; ++i) recomputed += ac.recomputes_layer(i);
    for (const Step& s : ranks) {
      EXPECT_EQ(s.exchanges, kMicroBatches * (args.num_hidden_layers * (3 + 5) + recomputed * 3));
    }
  }
}

// What is not set or not built is refused with one line: the group's all-to-all not set, a fused
// experts kernel (it would compute every expert on this rank's rows).
TEST(ExpertParallel, RefusesWhatIsNotBuilt) {
  const ModelArgs args = moe(4, 2);
  const std::vector<int32_t> ids(8, 1);
  ForwardOptions options;
  const ParallelizePlan plan = ep_plan(args, 1, 2);
  const std::unique_ptr<CausalLM> m = make_model(args, {}, DType::f32, Residency::committed, plan);
  EXPECT_NE(test::error_of([&] {
              m->forward(ids.data(), ids.data(), 1, 8, options);
            }).find("all-to-all is not set"),
            std::string::npos);
  const std::unique_ptr<CausalLM> fused = make_model(args, {{"*.mlp.experts", "experts_grouped"}},
                                                     DType::f32, Residency::committed, plan);
  LayerCollectives collectives;
  collectives.all_to_all_v = [](const void*, const std::vector<int64_t>&, void*,
                                const std::vector<int64_t>&, DType) {};
  fused->set_layer_collectives(collectives);
  EXPECT_NE(test::error_of([&] {
              fused->forward(ids.data(), ids.data(), 1, 8, options);
            }).find("expert parallel runs the stage slots"),
            std::string::npos);
}

}  // namespace
}  // namespace titan
