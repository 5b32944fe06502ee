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
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "expert_parallel_case.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/distributed/world.h"
#include "titan/train/job_config.h"

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
