// Expert parallel inside the model over MPI: the world's ranks (tests/CMakeLists.txt runs 2 under
// mpirun) are the EP group, the model's all_to_all_v the world communicator's
// (Communicator::all_to_all_v_async, waited for), and each rank's loss and gradients compared
// with the whole model's in this process as test_expert_parallel.cpp compares its thread ranks
// (the whole model's gradients summed over the ranks by an all-reduce): top-k 1 and 2 in fp32,
// top-k 2 in bf16. Also the load-balancing loss global over the ranks (the trainer's
// model.router_aux_loss_scope = "global") against one process on the ranks' micro-batches together.
//
// With TITAN_TEST_EP_STOP_RANK=r, rank r instead stops itself (SIGSTOP) inside the model's second
// exchange of the first forward (its rows on their way to the experts), while the others wait in
// that all-to-all-v, with the trainer's default comm.heartbeat_timeout_seconds:
// tests/e2e/ep_stopped_rank.sh checks that the job then ends within 60 s with one line per
// waiting rank naming the stopped one.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "expert_parallel_case.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/distributed/world.h"
#include "titan/train/job_config.h"
#include "titan/train/training_plan.h"

namespace titan {
namespace {

using test::ep_plan;
using test::expect_rank_equals_whole;
using test::kTolerance;
using test::moe;
using test::Step;
using test::Tensors;
using test::train_step;
using test::whole_weights;

// The rank TITAN_TEST_EP_STOP_RANK names, or -1.
int rank_to_stop() {
  const char* v = std::getenv("TITAN_TEST_EP_STOP_RANK");
  return v == nullptr ? -1 : std::atoi(v);
}

// This rank's EP model trained on its tokens, exchanging over the world.
Step expert_parallel_step(const ModelArgs& args, const Tensors& weights, DType dtype) {
  Communicator& comm = world();
  const ParallelizePlan plan = ep_plan(args, comm.rank(), comm.size());
  const std::unique_ptr<CausalLM> m = make_model(args, {}, dtype, Residency::committed, plan);
  const bool stops = comm.rank() == rank_to_stop();
  int64_t exchanges = 0;
  LayerCollectives collectives;
  collectives.all_to_all_v = [&](const void* send, const std::vector<int64_t>& send_counts,
                                 void* recv, const std::vector<int64_t>& recv_counts, DType type) {
    CommHandle handle = comm.all_to_all_v_async(send, send_counts, recv, recv_counts, type);
    if (stops && ++exchanges == 2) std::raise(SIGSTOP);
    handle.wait();
  };
  m->set_layer_collectives(collectives);
  return train_step(*m, plan, weights, comm.rank(), args.vocab_size);
}

void expect_world_equals_whole(const ModelArgs& args, DType dtype, double tolerance) {
  Communicator& comm = world();
  const Tensors weights = whole_weights(args);
  const std::unique_ptr<CausalLM> whole_model = make_model(args, {}, dtype);
  const Step whole =
      train_step(*whole_model, ParallelizePlan(), weights, comm.rank(), args.vocab_size);
  Tensors summed = whole.grads;
  for (auto& [name, grad] : summed) {
    comm.all_reduce_sum(grad.data(), static_cast<int64_t>(grad.size()));
  }
  const Step got = expert_parallel_step(args, weights, dtype);
  expect_rank_equals_whole(args, comm.rank(), comm.size(), got, whole, summed, tolerance);
}

TEST(ExpertParallelMpi, EveryRankEqualsTheWholeModelOnItsTokens) {
  ASSERT_EQ(4 % world().size(), 0) << "the world's ranks must divide the 4 experts";
  expect_world_equals_whole(moe(4, 1), DType::f32, kTolerance);
  expect_world_equals_whole(moe(4, 2), DType::f32, kTolerance);
  expect_world_equals_whole(moe(4, 2), DType::bf16, verify_checks::kBf16Tolerance);
}

// The load-balancing loss global over the ranks, as the trainer binds it under
// model.router_aux_loss_scope = "global" (ForwardOptions::sum_router_statistics: the world's
// all-reduce): every rank runs its two micro-batches on the whole model, the step averaging their
// load-balancing losses (aux_loss_scale 1/2), the coefficient raised to 0.1 so the term weighs.
// Each micro-batch's load-balancing loss is then one process's on the ranks' micro-batch i
// together (their rows one after another), the same on every rank, and the gradients summed over
// the ranks are that process's; without the sum (each rank's own tokens, averaged over every
// rank's micro-batches) the router's summed gradient is not.
TEST(ExpertParallelMpi, GlobalLoadBalancingEqualsOneProcessOnTheRanksMicroBatchesTogether) {
  Communicator& comm = world();
  ModelArgs args = moe(4, 2);
  args.router_aux_loss_coef = 0.1;
  const Tensors weights = whole_weights(args);
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / 28.0f;
  options.aux_loss_scale = 1.0f / static_cast<float>(test::kMicroBatches);
  std::vector<test::MicroBatch> together(test::kMicroBatches);
  for (int64_t r = 0; r < comm.size(); ++r) {
    const std::vector<test::MicroBatch> own = test::rank_micro_batches(r, args.vocab_size);
    for (size_t i = 0; i < own.size(); ++i) {
      together[i].inputs.insert(together[i].inputs.end(), own[i].inputs.begin(),
                                own[i].inputs.end());
      together[i].labels.insert(together[i].labels.end(), own[i].labels.begin(),
                                own[i].labels.end());
    }
  }
  const std::unique_ptr<CausalLM> one = make_model(args);
  const Step want =
      train_step(*one, ParallelizePlan(), weights, together, test::kBatch * comm.size(), options);
  // This rank's step on its micro-batches, its gradients summed over the ranks.
  const auto ranks_step = [&](bool global) {
    ForwardOptions o = options;
    if (global) {
      o.sum_router_statistics = [&comm](double* s, int64_t n) { comm.all_reduce_sum(s, n); };
    } else {
      o.aux_loss_scale = 1.0f / static_cast<float>(test::kMicroBatches * comm.size());
    }
    const std::unique_ptr<CausalLM> m = make_model(args);
    Step step = train_step(*m, ParallelizePlan(), weights,
                           test::rank_micro_batches(comm.rank(), args.vocab_size), test::kBatch, o);
    for (auto& [name, grad] : step.grads) {
      comm.all_reduce_sum(grad.data(), static_cast<int64_t>(grad.size()));
    }
    return step;
  };
  const Step global = ranks_step(true);
  EXPECT_NEAR(global.aux, want.aux, 1e-12 * want.aux) << "rank " << comm.rank();
  double loss_sums = global.loss - global.aux;
  comm.all_reduce_sum(&loss_sums, 1);
  EXPECT_NEAR(loss_sums, want.loss - want.aux, kTolerance * (want.loss - want.aux));
  for (const auto& [name, grad] : want.grads) {
    testing::expect_close("global " + name, global.grads.at(name).data(), grad.data(),
                          static_cast<int64_t>(grad.size()), kTolerance);
  }
  const Step local = ranks_step(false);
  const std::string router = "model.layers.0.mlp.gate.weight";
  const testing::ErrorStats apart =
      testing::compare_arrays(local.grads.at(router).data(), want.grads.at(router).data(),
                              static_cast<int64_t>(want.grads.at(router).size()));
  std::printf("rank %d: the router's gradient without the statistics summed: %.1e relative\n",
              comm.rank(), apart.rel());
  EXPECT_GT(apart.rel(), 100 * kTolerance);
}

// What the model's exchanges moved (Communicator::counts) against titan plan's formula
// (train/training_plan.h expert_parallel_row): exactly where the routing is known -- every token
// routed to expert 0 or 1 (top-1), both on rank 0: rank 1 sends all its rows and gets none back to
// compute, rank 0 the reverse -- in fp32 and bf16 (the inputs sent in bf16); under the random
// router's routing (top-2), the calls exactly and the bytes between none of the rows leaving and
// all of them, with the uniform routing's expectation printed beside.
TEST(ExpertParallelMpi, TheExchangesMoveWhatThePlanCounts) {
  Communicator& comm = world();
  if (comm.size() != 2) GTEST_SKIP() << "the known routing is laid out for 2 ranks";
  const int64_t tokens = test::kBatch * test::kSeq;
  const ActivationCheckpointing none = ActivationCheckpointing::none();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const ModelArgs args = moe(4, 1);
    const Tensors weights = whole_weights(args, true);
    const CommCounts before = comm.counts();
    expert_parallel_step(args, weights, dtype);
    const CollectiveCount got = comm.counts().since(before)[Collective::all_to_all_v];
    const auto all = static_cast<double>(tokens);
    const CommRow want =
        expert_parallel_row(args, 2, test::kMicroBatches, dtype, none, comm.rank() == 1 ? all : 0.0,
                            comm.rank() == 0 ? all : 0.0);
    EXPECT_EQ(got.calls, want.calls) << dtype_name(dtype);
    EXPECT_EQ(got.bytes, want.bytes) << dtype_name(dtype);
  }
  const ModelArgs args = moe(4, 2);
  const Tensors weights = whole_weights(args);
  const CommCounts before = comm.counts();
  expert_parallel_step(args, weights, DType::f32);
  const CollectiveCount got = comm.counts().since(before)[Collective::all_to_all_v];
  const auto rows = static_cast<double>(tokens * args.num_experts_per_tok);
  const auto row = [&](double out, double in) {
    return expert_parallel_row(args, 2, test::kMicroBatches, DType::f32, none, out, in);
  };
  const double uniform = uniform_routed_rows(args, 2, tokens);
  EXPECT_EQ(got.calls, row(0.0, 0.0).calls);
  EXPECT_GE(got.bytes, row(0.0, 0.0).bytes);
  EXPECT_LE(got.bytes, row(rows, rows).bytes);
  std::printf("rank %d: all-to-all-v %lld calls, %lld bytes; uniform routing's expectation %lld\n",
              comm.rank(), static_cast<long long>(got.calls), static_cast<long long>(got.bytes),
              static_cast<long long>(row(uniform, uniform).bytes));
}

}  // namespace
}  // namespace titan

// Every rank runs every test: the collectives meet in the same order on all of them.
int main(int argc, char** argv) {
  titan::init_world(&argc, &argv);
  // As titan train watches its ranks (train/trainer.cpp).
  titan::set_heartbeat_timeout(titan::JobConfig{}.comm.heartbeat_timeout_seconds,
                               "heartbeat_timeout_seconds");
  testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  titan::finalize_world();
  return failed;
}
