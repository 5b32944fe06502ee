// titan plan's figures against the real thing: the bytes each memory category holds after the
// trainer's start-up steps and at the peak of a training step -- one process, FSDP over 2 and 3
// ranks, dense and MoE, fp32 and bf16, with and without activation checkpointing -- and the
// bytes a step's collectives send, counted by a communicator that stands for N ranks (rank 0 of
// N; its collectives only count what a ring would send). The trainer's run under mpirun is
// checked against the plan by tests/e2e/plan_memory.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_of.h"
#include "scratch_dir.h"
#include "test_dataset_util.h"
#include "tiny_models.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/dispatch/registry.h"
#include "titan/distributed/data_parallel.h"
#include "titan/distributed/fsdp.h"
#include "titan/distributed/mesh.h"
#include "titan/models/causal_lm.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_export.h"
#include "titan/models/parallelize.h"
#include "titan/models/param_count.h"
#include "titan/models/registry.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/train/checkpoint.h"
#include "titan/train/comm_report.h"
#include "titan/train/fsdp_model.h"
#include "titan/train/job_config.h"
#include "titan/train/job_resolve.h"
#include "titan/train/lora_job.h"
#include "titan/train/optimizer.h"
#include "titan/train/parallelism.h"
#include "titan/train/training_plan.h"

namespace titan {
namespace {

// Rank 0 of `size` ranks: every collective counts the bytes a ring sends from this rank; an
// all-gather repeats this rank's rows (the other ranks' parameters, for memory's sake).
class CountingCommunicator final : public Communicator {
 public:
  // split_sizes: the sizes of the groups successive split() calls return (DeviceMesh splits the
  // shard group, then the replicate group, then the TP group).
  CountingCommunicator(int size, std::shared_ptr<int64_t> sent, std::deque<int> split_sizes = {})
      : size_(size), sent_(std::move(sent)), split_sizes_(std::move(split_sizes)) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void all_reduce_sum(float*, int64_t count) override { all_reduce(count, sizeof(float)); }
  void all_reduce_sum(double*, int64_t count) override { all_reduce(count, sizeof(double)); }
  void all_reduce_max(double*, int64_t count) override { all_reduce(count, sizeof(double)); }
  CommHandle all_gather_async(std::vector<CommPart> parts) override {
    for (const CommPart& p : parts) {
      const size_t width = dtype_size(p.dtype);
      auto* whole = static_cast<unsigned char*>(p.whole);
      for (const int64_t count : p.counts) {
        std::memcpy(whole, p.own, static_cast<size_t>(count) * width);
        whole += static_cast<size_t>(count) * width;
      }
      sent(p);
    }
    return {};
  }
  CommHandle gather_async(std::vector<CommPart> parts, int) override {
    for (const CommPart& p : parts) {  // the export's: after the steps, so not counted
      const size_t width = dtype_size(p.dtype);
      auto* whole = static_cast<unsigned char*>(p.whole);
      for (const int64_t count : p.counts) {
        std::memcpy(whole, p.own, static_cast<size_t>(count) * width);
        whole += static_cast<size_t>(count) * width;
      }
    }
    return {};
  }
  CommHandle reduce_scatter_sum_async(std::vector<CommPart> parts) override {
    for (const CommPart& p : parts) {
      std::memcpy(p.own, p.whole, static_cast<size_t>(p.counts[0]) * dtype_size(p.dtype));
      sent(p);
    }
    return {};
  }
  CommHandle all_to_all_v_async(const void*, const std::vector<int64_t>&, void*,
                                const std::vector<int64_t>&, DType) override {
    return {};  // no plan moves rows between ranks yet
  }
  std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send_counts) override {
    return send_counts;
  }
  void broadcast(float*, int64_t, int) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    TITAN_CHECK(!split_sizes_.empty(), "CountingCommunicator: more splits than sizes given");
    const int size = split_sizes_.front();
    split_sizes_.pop_front();
    return std::make_unique<CountingCommunicator>(size, sent_);
  }

 private:
  // A ring passes on every other rank's part.
  void sent(const CommPart& p) {
    *sent_ += (size_ - 1) * p.counts[0] * static_cast<int64_t>(dtype_size(p.dtype));
  }
  void all_reduce(int64_t count, size_t width) {
    *sent_ += 2 * (size_ - 1) * count * static_cast<int64_t>(width) / size_;
  }
  int size_;
  std::shared_ptr<int64_t> sent_;
  std::deque<int> split_sizes_;
};

int64_t current(MemCategory c) {
  return static_cast<int64_t>(memory_stats().current[static_cast<int>(c)]);
}

struct Case {
  std::string name;
  ModelArgs args;
  int64_t dp_replicate = 1, dp_shard = 1;
  DType dtype = DType::f32;
  ActivationCheckpointing checkpointing = {};
  int64_t micro_batches = 2;
  std::string reshard_after_forward = "default";
  LoraOptions lora = {};        // rank 0: full fine-tuning
  bool lora_base_bf16 = false;  // lora.base_dtype = "bfloat16" (with bf16 compute)
};

PlanInputs inputs_of(const Case& c) {
  PlanInputs in;
  in.args = c.args;
  in.mesh = {c.dp_replicate, c.dp_shard};
  in.local_batch_size = 2;
  in.seq_len = 24;
  in.accumulation_steps = c.micro_batches;
  in.compute_dtype = c.dtype;
  in.reshard_after_forward = c.reshard_after_forward;
  in.checkpointing = c.checkpointing;
  in.lora = c.lora;
  in.lora_base_bf16 = c.lora_base_bf16;
  return in;
}

// What the trainer does, in its order, with the memory it holds checked against the plan after
// each part, then the peak of `micro_batches` forward/backward passes and the bytes they send.
void check_against_model(const Case& c) {
  SCOPED_TRACE(c.name);
  const PlanInputs in = inputs_of(c);
  const TrainingPlan plan = plan_training(in);
  const MemoryPlan& m = plan.memory;
  memory_reset_peak();  // the case's own peak, start-up included
  const MemoryStats before = memory_stats();
  const auto grew = [&](MemCategory cat) {
    return current(cat) - static_cast<int64_t>(before.current[static_cast<int>(cat)]);
  };
  auto sent = std::make_shared<int64_t>(0);
  CountingCommunicator world(static_cast<int>(c.dp_replicate * c.dp_shard), sent,
                             {static_cast<int>(c.dp_shard), static_cast<int>(c.dp_replicate), 1});
  DeviceMesh mesh(world, in.mesh);

  const bool sharded = c.dp_shard > 1;
  // A base held in bf16 is made released and never holds its matmul weights in fp32 (the trainer
  // loads it; its values do not matter here).
  std::unique_ptr<CausalLM> model =
      make_model(c.args, {}, c.dtype,
                 sharded || c.lora_base_bf16 ? Residency::released : Residency::committed);
  model->set_activation_checkpointing(c.checkpointing);
  std::unique_ptr<LoraAdapter> lora;
  if (c.lora.rank > 0) {
    lora = std::make_unique<LoraAdapter>(c.args, c.lora);
    model->attach_lora(*lora);
  }
  model->allocate_gradients();
  if (lora) lora->allocate_gradients();
  std::unique_ptr<FullyShardedGroups> fsdp;
  std::unique_ptr<AdamWOptimizer> optimizer;
  if (sharded) {
    // A base held in bf16: the shards of the weights read only in bf16 are bf16 rows, loaded by
    // the trainer (zero here), never initialised in fp32.
    fsdp = std::make_unique<FullyShardedGroups>(
        model->param_groups(), mesh,
        c.lora_base_bf16 ? bf16_only_param_names(*model) : std::vector<std::vector<std::string>>{});
    shard_model(*model, *fsdp);
    fsdp->set_reshard_after_forward(c.reshard_after_forward);
    optimizer =
        std::make_unique<AdamWOptimizer>(lora ? lora->groups() : fsdp->shards(), AdamWConfig{});
    if (!c.lora_base_bf16) {
      fsdp->initialize([&](ParamGroup& g) { initialize_param_group(g, c.args, 7); });
    }
    if (lora) lora->initialize(7);
  } else {
    optimizer = std::make_unique<AdamWOptimizer>(lora ? lora->groups() : model->param_groups(),
                                                 AdamWConfig{});
    if (c.lora_base_bf16) {
      hold_lora_base_in_bf16(*model);
    } else {
      model->initialize(7);
    }
    if (lora) lora->initialize(7);
  }
  // Between steps (before the first): exactly the resident figures.
  EXPECT_EQ(grew(MemCategory::parameters), m.parameters + m.compute_copies);
  EXPECT_EQ(grew(MemCategory::gradients), m.gradients);
  EXPECT_EQ(grew(MemCategory::optimizer), m.optimizer);
  EXPECT_EQ(grew(MemCategory::other), m.collective_buffers);
  EXPECT_EQ(grew(MemCategory::activations), 0);

  // The peak is not reset here: start-up (a unit at a time under FSDP) stays under the step's.
  const int64_t n = in.local_batch_size * in.seq_len;
  std::vector<int32_t> ids(n), labels(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((i * 7 + 3) % c.args.vocab_size);
    labels[i] = static_cast<int32_t>((i * 5 + 1) % c.args.vocab_size);
  }
  ForwardOptions options;
  options.compute_grad = true;
  options.grad_scale = 1.0f / static_cast<float>(n);
  if (fsdp) {
    fsdp->zero_gradients();
  } else {
    model->zero_gradients();
  }
  if (lora) lora->zero_gradients();
  for (int64_t i = 0; i < c.micro_batches; ++i) {
    if (lora) lora->begin_dropout(7, 1, i * in.local_batch_size, in.seq_len);  // as the trainer
    model->forward(ids.data(), labels.data(), in.local_batch_size, in.seq_len, options);
    model->backward();
  }
  if (lora) lora->end_dropout();
  if (fsdp) fsdp->finish_gradients();
  if (lora) {
    all_reduce_gradients(lora->groups(), world);  // whole on every rank (Parallelism)
  } else if (!fsdp) {
    all_reduce_gradients(model->param_groups(), world);
  }
  const MemoryStats after = memory_stats();
  const auto by_category = m.step_by_category();
  for (int cat = 0; cat < kMemCategoryCount; ++cat) {
    SCOPED_TRACE(std::string(mem_category_name(static_cast<MemCategory>(cat))));
    EXPECT_EQ(static_cast<int64_t>(after.peak[cat] - before.current[cat]), by_category[cat]);
  }
  int64_t before_total = 0;
  for (const size_t bytes : before.current) before_total += static_cast<int64_t>(bytes);
  EXPECT_EQ(static_cast<int64_t>(after.total_peak) - before_total, m.step_peak());
  EXPECT_EQ(static_cast<int64_t>(after.total_current) - before_total,
            m.step_peak() - m.units_in_flight);
  EXPECT_EQ(m.activations, model->activation_bytes(in.local_batch_size, in.seq_len));
  EXPECT_EQ(*sent, plan.comm.per_step());
  if (fsdp) {
    // The final export: one run of a unit's parameters at a time gathered onto rank 0, the most
    // it holds beside the resident figures the plan's export_gather.
    // A base held in bf16 first widens its shards to fp32 (kept to the end).
    fsdp->release_all();
    const int64_t held = current(MemCategory::parameters);
    if (c.lora_base_bf16) fsdp->widen_bf16_shards();
    const int64_t widened = current(MemCategory::parameters) - held;
    EXPECT_EQ(widened > 0, c.lora_base_bf16);
    int64_t most = widened;
    for (const ExportRun& run : hf_export_runs(c.args, HfExportOptions{})) {
      fsdp->gather_to_root(run.group, run.params);
      most = std::max(most, current(MemCategory::parameters) - held);
    }
    fsdp->release_all();
    EXPECT_EQ(most, m.export_gather);
    EXPECT_EQ(current(MemCategory::parameters), held + widened);
  }
}

TEST(TrainingPlan, OneProcessMatchesTheAllocatedBuffers) {
  check_against_model({"dense tied", test::tiny_dense(true)});
  check_against_model({"dense untied, checkpointing", test::tiny_dense(false), 1, 1, DType::f32,
                       ActivationCheckpointing::full()});
  check_against_model({"dense bf16", test::tiny_dense(false), 1, 1, DType::bf16});
  check_against_model({"moe", test::with_moe(test::tiny_dense(false), 4, 2, 24, {1})});
  // LoRA: gradients and AdamW moments only for the adapter (the model frozen).
  Case lora{"dense LoRA", test::tiny_dense(false)};
  lora.lora = {4, 8.0, {"q_proj", "v_proj", "down_proj"}};
  check_against_model(lora);
  const TrainingPlan full = plan_training(inputs_of({"dense", test::tiny_dense(false)}));
  const TrainingPlan adapted = plan_training(inputs_of(lora));
  EXPECT_EQ(adapted.memory.parameters, full.memory.parameters + adapted.memory.lora_parameters);
  EXPECT_EQ(adapted.memory.gradients, adapted.memory.lora_parameters);
  EXPECT_EQ(adapted.memory.lora_saved,
            full.memory.gradients + full.memory.optimizer - 3 * adapted.memory.lora_parameters);
  // Under none the layers keep no norm outputs (DecoderLM::Retention::lora): selective op's arena.
  EXPECT_EQ(adapted.memory.activations,
            plan_training(inputs_of({"dense op", test::tiny_dense(false), 1, 1, DType::f32,
                                     ActivationCheckpointing::ops()}))
                .memory.activations);
  EXPECT_LT(adapted.memory.activations, full.memory.activations);
  // The rank-wide rooms (nn/lora.h): for the 2 x 24 tokens of a micro-batch, rank 4, the widest
  // adapted output (q_proj's, 64) and input (down_proj's, Im = 48): the fp32 and bf16 products
  // (2 N r each), B^T in fp32 and A, B, B^T rounded.
  const int64_t rank_rooms = 4 * (12 * 2 * 24 + 8 * 64 + 2 * 48);
  EXPECT_EQ(adapted.memory.lora_scratch, rank_rooms);
  // With dropout: its rooms for the widest adapted input (down_proj's, Im = 48) of a micro-batch
  // of 2 x 24 tokens, masked (fp32), its dx share (fp32) and rounded (bf16).
  Case dropping = lora;
  dropping.name = "dense LoRA, dropout";
  dropping.lora.dropout = 0.1;
  check_against_model(dropping);
  EXPECT_EQ(plan_training(inputs_of(dropping)).memory.lora_scratch, 2 * 24 * 48 * 10 + rank_rooms);
  dropping.name = "dense LoRA bf16, dropout";
  dropping.dtype = DType::bf16;
  check_against_model(dropping);
  // LoRA on a MoE: the sparse layer's experts adapted as PEFT does (gate_up_proj's pair of rank
  // 2r: A (4 x 8, 32), B (48, 8 x 4); down_proj's: A (4 x 4, 24), B (32, 4 x 4)), the dense
  // layer's MLP not; q_proj in both layers (A (4, 32), B (64, 4)).
  Case moe_lora{"moe LoRA", test::with_moe(test::tiny_dense(false), 4, 2, 24, {1})};
  moe_lora.lora = {4, 8.0, {"q_proj", "gate_proj", "up_proj", "down_proj"}};
  check_against_model(moe_lora);
  EXPECT_EQ(plan_training(inputs_of(moe_lora)).memory.lora_parameters,
            (2 * (128 + 256) + 1024 + 1536 + 384 + 512) * 4);
  // The scratch: gate, up and down merged and their gradients, E x h x Im = 4 x 32 x 24 each;
  // and q_proj's rank-wide rooms (input 32, output 64).
  EXPECT_EQ(plan_training(inputs_of(moe_lora)).memory.lora_scratch,
            6 * 4 * 32 * 24 * 4 + 4 * (12 * 2 * 24 + 8 * 64 + 2 * 32));
  moe_lora.name = "moe LoRA bf16";
  moe_lora.dtype = DType::bf16;
  check_against_model(moe_lora);
  moe_lora.dtype = DType::f32;
  // The attention alone: the frozen experts' backward skips their null weight gradients.
  moe_lora.name = "moe LoRA, attention only";
  moe_lora.lora.target_modules = {"q_proj", "v_proj"};
  check_against_model(moe_lora);
  // LoRA over a base held only in bf16: its matmul weights as bf16 copies, every group's at once
  // (no block in flight), fp32 masters only for the norms and the embedding; tied and untied.
  for (const bool tied : {false, true}) {
    Case held{tied ? "dense LoRA, bf16 base, tied" : "dense LoRA, bf16 base",
              test::tiny_dense(tied), 1, 1, DType::bf16};
    held.lora = lora.lora;
    held.lora_base_bf16 = true;
    check_against_model(held);
    Case copies = held;
    copies.lora_base_bf16 = false;
    const MemoryPlan with_masters = plan_training(inputs_of(copies)).memory;
    const MemoryPlan bf16_only = plan_training(inputs_of(held)).memory;
    EXPECT_EQ(bf16_only.block_copies, 0);
    // The masters of the weights read only in bf16 are what goes.
    int64_t matmul = 0;
    for (const ParamGroupSpec& g : model_param_specs(held.args)) {
      for (const ParamSpec& p : g.params) {
        if (DecoderLM::read_only_in_bf16(p.name)) matmul += shape_numel(p.shape);
      }
    }
    EXPECT_LT(bf16_only.step_peak(), with_masters.step_peak());
    EXPECT_EQ(bf16_only.compute_copies,
              (matmul + (tied ? held.args.vocab_size * held.args.hidden_size : 0)) * 2);
  }
  check_against_model({"moe bf16, checkpointing",
                       test::with_moe(test::tiny_dense(true), 4, 2, 24, {0}), 1, 1, DType::bf16,
                       ActivationCheckpointing::full()});
}

// Selective activation checkpointing, op-level (no norm outputs kept) and every 2nd layer (layers
// 1 and 3 recomputed, sharing one set): the run allocates what the plan predicts, step peak and
// every category, and its activations lie strictly between full's and none's.
TEST(TrainingPlan, SelectiveCheckpointingLiesBetweenFullAndNone) {
  ModelArgs dense = test::tiny_dense(false);
  dense.num_hidden_layers = 4;
  for (const bool moe : {false, true}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const ActivationCheckpointing& checkpointing :
           {ActivationCheckpointing::ops(), ActivationCheckpointing::every_nth_layer(2)}) {
        const Case c{std::string(moe ? "moe " : "dense ") + std::string(dtype_name(dtype)) + ", " +
                         checkpointing.name(),
                     moe ? test::with_moe(dense, 4, 2, 24, {1}) : dense,
                     1,
                     1,
                     dtype,
                     checkpointing};
        check_against_model(c);
        const MemoryPlan m = plan_training(inputs_of(c)).memory;
        EXPECT_LT(m.activations, m.activations_none) << c.name;
        EXPECT_GT(m.activations, m.activations_full) << c.name;
      }
    }
  }
}

TEST(TrainingPlan, FsdpMatchesTheShardsAndTheUnitInFlight) {
  // 97 vocabulary rows, 2 kv heads and 4 experts over 3 ranks: every kind of padded shard.
  check_against_model({"fsdp 2", test::tiny_dense(true), 1, 2});
  check_against_model({"fsdp 3 untied", test::tiny_dense(false), 1, 3});
  check_against_model({"fsdp 3, checkpointing", test::tiny_dense(true), 1, 3, DType::f32,
                       ActivationCheckpointing::full()});
  check_against_model({"fsdp 2 moe", test::with_moe(test::tiny_dense(false), 4, 2, 24, {1}), 1, 2});
  check_against_model({"fsdp 3 moe, one micro-batch",
                       test::with_moe(test::tiny_dense(true), 4, 2, 24, {}), 1, 3, DType::f32,
                       ActivationCheckpointing::none(), 1});
  // bf16: the matmul weights are gathered in bf16 into the unit's copies, which exist only in
  // flight, beside the masters read in fp32 (a tied embedding's among them); start-up's whole
  // fp32 unit may be the parameters' peak.
  check_against_model({"fsdp 2 bf16", test::tiny_dense(false), 1, 2, DType::bf16});
  check_against_model({"fsdp 3 moe bf16", test::with_moe(test::tiny_dense(true), 4, 2, 24, {1}), 1,
                       3, DType::bf16});
  // Every unit whole from its forward to its backward, or gathered again for it.
  check_against_model({"fsdp 2 never", test::tiny_dense(true), 1, 2, DType::f32,
                       ActivationCheckpointing::none(), 2, "never"});
  check_against_model({"fsdp 3 bf16 always", test::tiny_dense(false), 1, 3, DType::bf16,
                       ActivationCheckpointing::none(), 2, "always"});
  // Kept units keep their bf16 copies (their masters of them were never gathered).
  check_against_model({"fsdp 2 bf16 never, tied", test::tiny_dense(true), 1, 2, DType::bf16,
                       ActivationCheckpointing::none(), 2, "never"});
}

// The most a synchronous save holds on rank 0 beyond what it held before (Parallelism::
// checkpoint_source: one tensor at a time gathered whole as the writer reaches it, in the
// writer's order), every tensor handed back after.
int64_t measured_checkpoint_gather(Parallelism& parallelism, const ModelArgs& args) {
  int64_t resident = 0;
  for (const size_t b : memory_stats().current) resident += static_cast<int64_t>(b);
  memory_reset_peak();
  Parallelism::CheckpointSource source = parallelism.checkpoint_source(false, false);
  EXPECT_TRUE(source.gather);
  for (const CheckpointTensor& t : checkpoint_read_order(model_param_specs(args), false)) {
    source.gather(t);
  }
  parallelism.end_checkpoint();
  int64_t after = 0;
  for (const size_t b : memory_stats().current) after += static_cast<int64_t>(b);
  EXPECT_EQ(after, resident);
  return static_cast<int64_t>(memory_stats().total_peak) - resident;
}

// FSDP 2 x EP 2 (this is rank 0 of 4): 6 experts, 3 a rank, each expert tensor's 3 rows sharded
// over the 2 ranks holding them (2 rows, one of them padding), the rest over all 4. What the
// trainer's Parallelism holds between steps, the most the export holds on rank 0 (a run of its
// part gathered from the shards beside the whole run gathered from its EP group) and the most a
// save holds (a tensor's rows gathered onto rank 0's EP group beside the whole tensor), against
// the plan. (A step's all-to-all-v's need every rank's rows: tests/e2e/plan_memory.sh measures
// the step.)
TEST(TrainingPlan, FsdpTimesEpHoldsTheShardsOfBothKinds) {
  // Layer 1 dense, its MLP as large as layer 0's 6 experts, so the export's most is layer 1's run
  // gathered from the shards beside layer 0's whole run, handed back only after it.
  ModelArgs args = test::with_moe(test::tiny_dense(false), 6, 2, 16, {1});
  args.intermediate_size = 96;
  PlanInputs in = inputs_of({"fsdp 2 x ep 2", args, 1, 4});
  in.mesh.ep = 2;
  in.export_hf = true;
  PlanInputs saving = in;
  saving.checkpoint_saves = true;
  const MemoryPlan m = plan_training(in).memory;
  EXPECT_EQ(m.checkpoint_gather, 0);
  auto sent = std::make_shared<int64_t>(0);
  // DeviceMesh's splits: the shard group, the replicas, TP, EP, the ranks holding the same
  // experts, those of this replica.
  CountingCommunicator world(4, sent, {4, 1, 1, 2, 2, 2});
  DeviceMesh mesh(world, in.mesh);
  const ParallelizePlan parallelize = Parallelism::plan(in.args, Parallelism::axes(mesh, false));
  const auto total = [] {
    int64_t bytes = 0;
    for (const size_t b : memory_stats().current) bytes += static_cast<int64_t>(b);
    return bytes;
  };
  const MemoryStats before = memory_stats();
  const auto grew = [&](MemCategory cat) {
    return current(cat) - static_cast<int64_t>(before.current[static_cast<int>(cat)]);
  };
  std::unique_ptr<CausalLM> model =
      make_model(in.args, {}, DType::f32, Parallelism::param_residency(mesh), parallelize);
  model->allocate_gradients();
  Parallelism parallelism(*model, mesh, parallelize, "default");
  AdamWOptimizer optimizer(parallelism.state_groups(), AdamWConfig{});
  parallelism.initialize(in.args, 7);
  EXPECT_EQ(grew(MemCategory::parameters), m.parameters);
  EXPECT_EQ(grew(MemCategory::gradients), m.gradients);
  EXPECT_EQ(grew(MemCategory::optimizer), m.optimizer);
  EXPECT_EQ(grew(MemCategory::other), m.collective_buffers);

  const int64_t resident = total();
  memory_reset_peak();
  for (const ExportRun& run : hf_export_runs(in.args, HfExportOptions{})) {
    parallelism.gather_for_export(run);
  }
  parallelism.end_export();
  EXPECT_EQ(static_cast<int64_t>(memory_stats().total_peak) - resident, m.export_gather);
  EXPECT_EQ(total(), resident);
  const int64_t planned = plan_training(saving).memory.checkpoint_gather;
  EXPECT_GT(planned, 0);
  EXPECT_EQ(measured_checkpoint_gather(parallelism, in.args), planned);
}

// FSDP 2 x TP 2 (rank 0 of 4): a save gathers each tensor's shard rows onto rank 0's TP group,
// then its TP cuts onto rank 0 -- a row-wise parameter's cuts beside the whole before they are
// placed. The most it holds on rank 0 against the plan; and under FSDP 2 x TP 2 x EP 2 (4 experts,
// 2 an EP rank, FSDP-sharded over the 2 ranks holding them) likewise, the experts gathered over
// the EP group (here rank 0's TP group) and the rest over TP.
TEST(TrainingPlan, FsdpTimesTpSavesOneTensorAtATime) {
  // A vocabulary TP 2 divides: 49 rows a TP rank, 25 an FSDP shard (one of them padding).
  ModelArgs args = test::tiny_dense(false);
  args.vocab_size = 98;
  PlanInputs in = inputs_of({"fsdp 2 x tp 2", args, 1, 2});
  in.mesh.tp = 2;
  in.checkpoint_saves = true;
  const int64_t planned = plan_training(in).memory.checkpoint_gather;
  EXPECT_GT(planned, 0);
  auto sent = std::make_shared<int64_t>(0);
  // DeviceMesh's splits: the shard group, the replicas, TP, the data-parallel ranks.
  CountingCommunicator world(4, sent, {2, 1, 2, 2});
  DeviceMesh mesh(world, in.mesh);
  const ParallelizePlan parallelize = Parallelism::plan(in.args, Parallelism::axes(mesh, true));
  std::unique_ptr<CausalLM> model =
      make_model(in.args, {}, DType::f32, Parallelism::param_residency(mesh), parallelize);
  model->allocate_gradients();
  Parallelism parallelism(*model, mesh, parallelize, "default");
  AdamWOptimizer optimizer(parallelism.state_groups(), AdamWConfig{});
  parallelism.initialize(in.args, 7);
  EXPECT_EQ(measured_checkpoint_gather(parallelism, in.args), planned);

  PlanInputs three_ways =
      inputs_of({"fsdp 2 x tp 2 x ep 2", test::with_moe(args, 4, 2, 16, {}), 1, 2});
  three_ways.mesh.tp = 2;
  three_ways.mesh.ep = 2;
  three_ways.checkpoint_saves = true;
  const int64_t planned_three_ways = plan_training(three_ways).memory.checkpoint_gather;
  EXPECT_GT(planned_three_ways, 0);
  // DeviceMesh's splits: the shard group, the replicas, TP, the data-parallel ranks, EP, the
  // ranks holding the same experts, those of this replica.
  CountingCommunicator three_ways_world(4, sent, {2, 1, 2, 2, 2, 2, 2});
  DeviceMesh three_ways_mesh(three_ways_world, three_ways.mesh);
  const ParallelizePlan three_ways_plan =
      Parallelism::plan(three_ways.args, Parallelism::axes(three_ways_mesh, true));
  std::unique_ptr<CausalLM> moe =
      make_model(three_ways.args, {}, DType::f32, Parallelism::param_residency(three_ways_mesh),
                 three_ways_plan);
  moe->allocate_gradients();
  Parallelism moe_parallelism(*moe, three_ways_mesh, three_ways_plan, "default");
  AdamWOptimizer moe_optimizer(moe_parallelism.state_groups(), AdamWConfig{});
  moe_parallelism.initialize(three_ways.args, 7);
  EXPECT_EQ(measured_checkpoint_gather(moe_parallelism, three_ways.args), planned_three_ways);
}

TEST(TrainingPlan, LoraReplicasAllReduceTheAdapterOnly) {
  Case c{"DDP LoRA", test::tiny_dense(true), 2, 1};
  c.lora = {8, 16.0, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  check_against_model(c);
}

// FSDP shards the frozen model (no gradients in flight, no reduce-scatter); the adapter is whole
// on every rank and all-reduced over all of them.
TEST(TrainingPlan, LoraUnderFsdpShardsTheFrozenModel) {
  const LoraOptions all = {
      8, 16.0, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  Case fsdp{"FSDP 2 LoRA", test::tiny_dense(true), 1, 2};
  fsdp.lora = all;
  check_against_model(fsdp);
  Case hsdp{"HSDP 2x3 LoRA bf16", test::tiny_dense(false), 2, 3, DType::bf16};
  hsdp.lora = all;
  check_against_model(hsdp);
  const TrainingPlan plan = plan_training(inputs_of(fsdp));
  EXPECT_EQ(plan.comm.reduce_scatter, 0);
  EXPECT_EQ(plan.memory.unit_gradients, 0);
  // A base held in bf16 (lora.base_dtype): the shards of the weights read only in bf16 are bf16
  // rows, the gathers send them as they are (no send buffer for them: a tied embedding's lm_head
  // gather still rounds its fp32 rows), the same bytes as with fp32 masters; tied and untied,
  // FSDP and HSDP.
  for (const bool tied : {true, false}) {
    Case held{tied ? "FSDP 2 LoRA, bf16 base, tied" : "HSDP 2x3 LoRA, bf16 base",
              test::tiny_dense(tied), tied ? 1 : 2, tied ? 2 : 3, DType::bf16};
    held.lora = all;
    held.lora_base_bf16 = true;
    check_against_model(held);
    Case masters = held;
    masters.lora_base_bf16 = false;
    const TrainingPlan bf16_only = plan_training(inputs_of(held));
    const TrainingPlan with_masters = plan_training(inputs_of(masters));
    // The shards of the matmul weights: 2 bytes an element in place of 4 (and of their views'
    // alignment, under 16 floats each).
    int64_t matmul_rows = 0, matmuls = 0;
    for (const ParamGroupSpec& g : model_param_specs(held.args)) {
      for (const ParamSpec& p : g.params) {
        if (!DecoderLM::read_only_in_bf16(p.name)) continue;
        matmul_rows += shape_numel(Shard{0, held.dp_shard}.spec_of(p).shape);
        ++matmuls;
      }
    }
    EXPECT_EQ(bf16_only.memory.compute_copies, 2 * matmul_rows);
    const int64_t masters_gone = with_masters.memory.parameters - bf16_only.memory.parameters;
    EXPECT_GE(masters_gone, 4 * matmul_rows);
    EXPECT_LT(masters_gone, 4 * (matmul_rows + 16 * matmuls));
    EXPECT_EQ(bf16_only.comm.all_gather_forward, with_masters.comm.all_gather_forward);
    EXPECT_LT(bf16_only.memory.collective_buffers, with_masters.memory.collective_buffers);
  }
  // LoRA on a MoE's experts under bf16: the adapted experts gathered in fp32 (their merge reads
  // the masters), the other matmul weights in bf16; gate_up alone, and all three.
  for (const bool down : {false, true}) {
    Case moe{down ? "FSDP 2 bf16 MoE LoRA" : "FSDP 2 bf16 MoE LoRA, gate_up only",
             test::with_moe(test::tiny_dense(false), 4, 2, 24, {1}), 1, 2, DType::bf16};
    moe.lora = {4, 8.0, {"q_proj", "gate_proj", "up_proj"}};
    if (down) moe.lora.target_modules.push_back("down_proj");
    check_against_model(moe);
    Case plain = moe;
    plain.lora.target_modules = {"q_proj"};
    // The sparse unit's gathers send the adapted experts' rows in fp32 (check_against_model
    // counted the bytes sent): more than in bf16.
    EXPECT_GT(plan_training(inputs_of(moe)).comm.all_gather_forward,
              plan_training(inputs_of(plain)).comm.all_gather_forward);
  }
}

TEST(TrainingPlan, ReplicasAllReduceOncePerStep) {
  check_against_model({"ddp 2", test::tiny_dense(true), 2, 1});
  check_against_model({"ddp 3, one micro-batch", test::tiny_dense(false), 3, 1, DType::f32,
                       ActivationCheckpointing::none(), 1});
  check_against_model({"hsdp 2 x 2", test::tiny_dense(true), 2, 2});
  check_against_model(
      {"hsdp 2 x 3 moe", test::with_moe(test::tiny_dense(false), 4, 2, 24, {}), 2, 3});
}

// Under tensor parallel the plan counts rank 0's parts as its model allocates them, and the
// activations of its local heads, widths and vocabulary rows.
TEST(TrainingPlan, TensorParallelCountsRankZerosParts) {
  ModelArgs a = test::tiny_dense(false);
  a.vocab_size = 96;  // 2 ranks cut the vocabulary and the key/value heads evenly
  a.num_key_value_heads = 2;
  PlanInputs in = inputs_of({"tp 2", a});
  in.mesh = {1, 1, 2};
  const MemoryPlan tp = plan_training(in).memory;
  const std::unique_ptr<CausalLM> rank0 =
      make_model(a, {}, DType::f32, Residency::committed, parallelize_decoder(a, {0, 2, 0, 1}));
  int64_t floats = 0;
  for (const ParamGroup& g : rank0->param_groups()) floats += g.numel();
  EXPECT_EQ(tp.parameters, floats * 4);
  EXPECT_EQ(tp.activations,
            DecoderLM::activation_bytes_of(a, DType::f32, in.checkpointing, in.local_batch_size,
                                           in.seq_len, {.tp_degree = 2}));
  const MemoryPlan one = plan_training(inputs_of({"one process", a})).memory;
  EXPECT_LT(tp.parameters, one.parameters);
  EXPECT_LT(tp.activations, one.activations);
}

TEST(TrainingPlan, ThePeakIsTheWriterOrTheExportWhenTheyAreHigher) {
  PlanInputs in = inputs_of({"fsdp 2", test::tiny_dense(true), 1, 2});
  TrainingPlan plan = plan_training(in);
  const MemoryPlan& m = plan.memory;
  EXPECT_EQ(plan.peak(), m.step_peak());
  // The writer's 32 MiB outweigh these tiny models' steps.
  in.checkpoint_saves = true;
  EXPECT_EQ(plan_training(in).peak(), m.step_peak() - m.units_in_flight + 2 * (int64_t{16} << 20));
  in.export_hf = true;
  plan = plan_training(in);
  EXPECT_EQ(plan.peak(), plan.memory.export_peak());
  // The export gathers one run of one unit at a time onto rank 0 (check_against_model measures
  // it): the largest unit at most, well below one process's parameters; a LoRA adapter alone
  // (no merge) gathers none.
  const int64_t largest_unit = plan.memory.export_gather;
  EXPECT_GT(largest_unit, 0);
  in.mesh = {1, 1};
  EXPECT_LT(2 * largest_unit, plan_training(in).memory.parameters);
  in.mesh = {1, 2};
  in.export_model_weights = false;
  EXPECT_EQ(plan_training(in).memory.export_gather, 0);
}

// The trainer's end-of-run report, which tests/e2e/comm_counts.sh compares with the plan's table:
// whole numbers per step, a count that differs between steps (expert parallel's rows follow the
// routing) its mean rounded, and said so.
TEST(CommReport, PrintsWholeNumbersPerStep) {
  CommCounts counts;
  for (int i = 0; i < 4; ++i) counts.add(Collective::all_reduce, 8);
  for (const int64_t bytes : {100, 101, 100, 100}) counts.add(Collective::all_to_all_v, bytes);
  const std::string lines = comm_report_lines({{"ep", counts}}, 2);
  for (const char* expected : {" all_reduce ", " 2 calls ", " 16 bytes (16 B)\n", " all_to_all_v ",
                               " 201 bytes (201 B; the steps' mean, rounded)\n"}) {
    EXPECT_NE(lines.find(expected), std::string::npos) << expected << " in\n" << lines;
  }
  EXPECT_EQ(lines.find('.'), std::string::npos) << lines;
}

std::string error_of(const std::vector<std::string>& flags, int64_t world) {
  return test::error_of([&] {
    JobConfig config = job_config_preset("tiny");
    for (const std::string& f : flags) job_config_apply_override(config, f);
    plan_inputs(config, world);
  });
}

TEST(TrainingPlan, ResolvesTheConfigAsTheTrainerDoes) {
  JobConfig config = job_config_preset("tiny");
  job_config_apply_override(config, "--training.global_batch_size=48");
  job_config_apply_override(config, "--parallelism.data_parallel_replicate_degree=2");
  const PlanInputs in = plan_inputs(config, 6);
  EXPECT_EQ(in.mesh.dp_replicate, 2);
  EXPECT_EQ(in.mesh.dp_shard, 3);
  EXPECT_EQ(in.accumulation_steps, 48 / (8 * 6));
  EXPECT_EQ(in.args.num_hidden_layers, 4);
  EXPECT_EQ(in.seq_len, 256);

  EXPECT_NE(error_of({"--training.global_batch_size=12"}, 2)
                .find("training.global_batch_size (12) is not a multiple of local_batch_size x "
                      "data-parallel ranks (8 x 2)"),
            std::string::npos);
  EXPECT_NE(error_of({"--parallelism.data_parallel_replicate_degree=3"}, 2)
                .find("does not divide the world of 2 ranks"),
            std::string::npos);
  EXPECT_NE(error_of({"--training.seq_len=100000"}, 1).find("exceeds the model's"),
            std::string::npos);
  EXPECT_NE(error_of({"--model.name=llama3"}, 1).find("model.name 'llama3' does not match"),
            std::string::npos);
}

TEST(TrainingPlan, RefusesTheOverridesTheTrainerRefuses) {
  JobConfig config = job_config_preset("tiny");
  const std::vector<OverrideRule> rules = {{"model.layers.*.mlp", "no_such_kernel"}};
  config.overrides = {{rules[0].pattern, rules[0].kernel}};
  const std::string plan_error = test::error_of([&] { plan_inputs(config, 1); });
  EXPECT_NE(plan_error, "no error");
  EXPECT_EQ(plan_error,
            test::error_of([&] { make_model(resolve_job_model_args(config), rules, DType::f32); }));
  // A rule that matches nothing is a warning in both.
  config.overrides = {{"model.layers.*.no_such_module", "swiglu_reference"}};
  const std::vector<std::string> warnings = plan_inputs(config, 1).override_warnings;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings,
            make_model(resolve_job_model_args(config),
                       {{"model.layers.*.no_such_module", "swiglu_reference"}}, DType::f32)
                ->override_report()
                .warnings);
  config.overrides.clear();
  config.experimental.custom_import = "/nonexistent/libkernels.so";
  try {
    plan_inputs(config, 1);
    ADD_FAILURE() << "a missing kernel plugin passed the plan";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "kernel plugin '/nonexistent/libkernels.so': no such file");
  }
}

// A kernel's constraint on the step's shapes (its `check`), refused by the plan with the line
// the trainer's start-up check (CausalLM::check_kernel_constraints) gives.
TEST(TrainingPlan, RefusesTheKernelConstraintsTheTrainerRefuses) {
  static const bool registered = [] {
    const AttentionKernel& reference = std::get<AttentionKernel>(
        kernel_registry().get("attention_reference", OpKind::attention).impl);
    kernel_registry().add({"attention_test_64_positions",
                           OpKind::attention,
                           {DType::f32},
                           "test only",
                           AttentionKernel{reference.forward, reference.backward,
                                           [](const AttentionShape& s) -> std::string {
                                             return s.seq_kv <= 64 ? "" : "seq_kv <= 64";
                                           }}});
    return true;
  }();
  ASSERT_TRUE(registered);
  JobConfig config = job_config_preset("tiny");
  config.training.seq_len = 65;
  const std::vector<OverrideRule> rules = {
      {"model.layers.1.self_attn", "attention_test_64_positions"}};
  config.overrides = {{rules[0].pattern, rules[0].kernel}};
  const std::string plan_error = test::error_of([&] { plan_inputs(config, 1); });
  EXPECT_EQ(plan_error,
            "model.layers.1.self_attn: attention kernel 'attention_test_64_positions' requires "
            "seq_kv <= 64");
  EXPECT_EQ(plan_error, test::error_of([&] {
              make_model(resolve_job_model_args(config), rules, DType::f32)
                  ->check_kernel_constraints(config.training.local_batch_size,
                                             config.training.seq_len);
            }));
  config.training.seq_len = 64;
  EXPECT_NO_THROW(plan_inputs(config, 1));
}

// check_job_sizes holds bounds to 1 EiB before anything is computed in int64_t; each bound must
// lie above the real figure, for every built-in preset, one process and FSDP, fp32 and bf16.
TEST(TrainingPlan, TheSizeBoundsLieAboveThePlansFigures) {
  for (const char* preset :
       {"tiny", "tiny_moe", "debugmodel", "debugmodel_moe", "qwen3_0.6b", "qwen3_30b_a3b"}) {
    for (const int64_t world : {1, 4}) {
      for (const char* dtype : {"float32", "bfloat16"}) {
        JobConfig config = job_config_preset(preset);
        config.training.mixed_precision_param = dtype;
        config.training.seq_len = std::min<int64_t>(config.training.seq_len, 512);
        config.training.global_batch_size = 2 * config.training.local_batch_size * world;
        const PlanInputs in = plan_inputs(config, world);
        const TrainingPlan plan = plan_training(in);
        const JobSizeBounds b = job_size_bounds(config, in.args, in.mesh);
        const MemoryPlan& m = plan.memory;
        const std::string what =
            std::string(preset) + " " + dtype + " world " + std::to_string(world);
        EXPECT_GE(b.parameters, static_cast<long double>(plan.parameter_count)) << what;
        EXPECT_GE(b.parameter_bytes,
                  static_cast<long double>(m.parameters + m.compute_copies + m.block_copies +
                                           m.gradients + m.optimizer + m.units_in_flight +
                                           m.collective_buffers + m.export_gather))
            << what;
        EXPECT_GE(b.activation_bytes, static_cast<long double>(m.activations_none)) << what;
        EXPECT_GE(b.activation_bytes, static_cast<long double>(m.activations_full)) << what;
        EXPECT_GE(b.step_tokens, static_cast<long double>(plan.tokens_per_step)) << what;
        EXPECT_GE(b.sent_bytes, static_cast<long double>(plan.comm.per_step())) << what;
      }
    }
  }
}

// Absurd configs are refused in one line naming the keys, never planned with wrapped figures
// (before: 1e6 layers of hidden 1e6 printed -6887341995226103232 parameters, exit 0).
TEST(TrainingPlan, AbsurdSizesAreRefusedNotWrapped) {
  const test::ScratchDir dir;
  const auto folder = [&](const std::string& name, const nlohmann::json& fields) {
    nlohmann::json config = {{"architectures", {"Qwen3ForCausalLM"}},
                             {"model_type", "qwen3"},
                             {"vocab_size", 151936},
                             {"hidden_size", 1024},
                             {"intermediate_size", 3072},
                             {"num_hidden_layers", 28},
                             {"num_attention_heads", 16},
                             {"num_key_value_heads", 8},
                             {"head_dim", 128},
                             {"max_position_embeddings", 40960},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 1000000},
                             {"tie_word_embeddings", true}};
    config.update(fields);
    std::filesystem::create_directories(dir / name);
    test::write_text(dir / (name + "/config.json"), config.dump());
    return dir / name;
  };
  const auto plan_error = [](const std::string& path, const std::vector<std::string>& flags) {
    return test::error_of([&] {
      JobConfig config = job_config_preset("hf");
      config.model.hf_assets_path = path;
      for (const std::string& f : flags) job_config_apply_override(config, f);
      plan_inputs(config, 1);
    });
  };
  const std::string layers = folder("layers", {{"num_hidden_layers", 1000000}});
  {  // 1e6 layers of hidden 1024 fit (about 1.6e16 bytes): planned, every figure exact
    JobConfig config = job_config_preset("hf");
    config.model.hf_assets_path = layers;
    const TrainingPlan plan = plan_training(plan_inputs(config, 1));
    const int64_t per_layer = count_parameters(plan.inputs.args).total / 1000000;
    EXPECT_GT(per_layer, 10000000);
    EXPECT_GT(plan.memory.parameters, 4 * 1000000 * per_layer);
    EXPECT_GT(plan.peak(), plan.memory.parameters + plan.memory.gradients + plan.memory.optimizer);
  }
  const std::string huge = folder(
      "huge",
      {{"num_hidden_layers", 1000000}, {"hidden_size", 1000000}, {"intermediate_size", 10000000}});
  const std::string huge_error = plan_error(huge, {"--model.hf_assets_path=" + huge});
  EXPECT_TRUE(huge_error.starts_with(huge + "/config.json: the model's parameters "
                                            "(num_hidden_layers 1000000 x about "))
      << huge_error;
  EXPECT_TRUE(
      huge_error.ends_with(" per rank, beyond what titan counts (1152921504606846976 "
                           "bytes, 1 EiB)"))
      << huge_error;
  const std::string long_seq = folder("long_seq", {{"num_hidden_layers", 100000},
                                                   {"hidden_size", 65536},
                                                   {"max_position_embeddings", 2000000000}});
  const std::string seq_error =
      plan_error(long_seq, {"--model.hf_assets_path=" + long_seq, "--training.seq_len=2000000000",
                            "--training.local_batch_size=1000"});
  EXPECT_TRUE(
      seq_error.starts_with("training.seq_len (2000000000) x training.local_batch_size "
                            "(1000) x num_hidden_layers (100000, " +
                            long_seq + "/config.json): the activations would take up to "))
      << seq_error;
  // The batch keys of the built-in tiny flavor.
  EXPECT_TRUE(error_of({"--training.local_batch_size=100000000000000"}, 1)
                  .starts_with("training.seq_len (256) x training.local_batch_size "
                               "(100000000000000) x num_hidden_layers (4, flavor 'tiny')"))
      << error_of({"--training.local_batch_size=100000000000000"}, 1);
  EXPECT_EQ(error_of({"--training.local_batch_size=4611686018427387904"}, 2),
            "training.local_batch_size (4611686018427387904) x data-parallel ranks (2) is beyond "
            "what titan counts (1152921504606846976)");
  EXPECT_TRUE(error_of({"--training.global_batch_size=9000000000000000000"}, 1)
                  .starts_with("training.global_batch_size (about 9e+18 sequences) x "
                               "training.seq_len (256): about 2.3e+21 tokens per step"))
      << error_of({"--training.global_batch_size=9000000000000000000"}, 1);
}

}  // namespace
}  // namespace titan
