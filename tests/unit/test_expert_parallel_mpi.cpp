// Expert parallel inside the model over MPI: the world's ranks (tests/CMakeLists.txt runs 2 under
// mpirun) are the EP group, the model's all_to_all_v the world communicator's
// (Communicator::all_to_all_v_async, waited for), and each rank's loss and gradients compared
// with the whole model's in this process as test_expert_parallel.cpp compares its thread ranks
// (the whole model's gradients summed over the ranks by an all-reduce): top-k 1 and 2 in fp32,
// top-k 2 in bf16.
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
