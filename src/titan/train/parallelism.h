// The parallelisms of a training run, applied to its model in torchtitan's order -- tensor
// parallel (the parallelize plan the model is built with: models/parallelize.h), expert parallel
// (the plan's whole experts per rank, the model's all-to-all-v over the mesh's EP group), then
// FSDP/HSDP or DDP over the data-parallel mesh -- and everything the trainer asks of them, so
// the loop has no branch per parallelism: where the optimizer state lives and how checkpoints cut
// it, how a step's gradients are zeroed and reduced, who writes a checkpoint, and how the whole
// model is brought together for an export.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/distributed/fsdp.h"
#include "titan/distributed/mesh.h"
#include "titan/models/causal_lm.h"
#include "titan/models/hf_export.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/nn/parallel_plan.h"
#include "titan/train/checkpoint.h"
#include "titan/train/optimizer.h"

namespace titan {

class Parallelism {
 public:
  // This rank's place on the mesh's tensor-parallel axis (`sequence_parallel`:
  // parallelism.enable_sequence_parallel) and expert-parallel axis, and the plan its model is
  // built with (make_model's `plan`): every parameter whole without TP and EP.
  static ParallelAxes axes(const DeviceMesh& mesh, bool sequence_parallel);
  static ParallelizePlan plan(const ModelArgs& args, const ParallelAxes& axes);
  // How the model's parameter groups start (make_model's `params`): under FSDP no rank ever holds
  // the whole model, so they start released and are initialised or loaded a unit at a time.
  static Residency param_residency(const DeviceMesh& mesh);

  // Wraps `model` (built with `plan` and param_residency()); FSDP installs its hooks here, under
  // TP the model's collectives become the TP group's all-reduces, and under EP its all-to-all-v
  // the EP group's.
  // `reshard_after_forward`: parallelism.fsdp_reshard_after_forward. Both must outlive this.
  // `base_in_bf16` (a frozen LoRA base, lora.base_dtype = "bfloat16": train/lora_job.h, the model
  // made released and under bf16 compute): the weights it reads only in bf16 held only in bf16 --
  // under FSDP as bf16 shards (FullyShardedGroups' bf16_shards), else as the model's own copies
  // (hold_lora_base_in_bf16) --, loaded into model_groups(), never initialised.
  Parallelism(CausalLM& model, DeviceMesh& mesh, const ParallelizePlan& plan,
              const std::string& reshard_after_forward, bool base_in_bf16 = false);
  ~Parallelism();
  // The groups that train in place of the model's frozen ones (a LoRA adapter's: train/lora_job.h):
  // what the optimizer steps, checkpoints hold (whole, written by rank 0) and the data-parallel
  // reduction sums over every rank: they are replicated, while FSDP still shards the frozen model.
  // Under TP they hold the plan's cuts of `whole` (what a checkpoint holds): the cut parameters'
  // gradients are the rank's own, the replicated ones' partial sums over the TP group's parts of
  // the base, summed over the TP group by finish_gradients. `groups` must outlive this.
  void train_only(std::vector<ParamGroup>& groups, const std::vector<ParamGroupSpec>& whole);

  // The model's own parameters as this rank holds them -- FSDP's shards, or the model's whole
  // groups -- and their cut: where its weights are initialised or loaded.
  std::vector<ParamGroup>& model_groups();
  Shard model_cut() const;

  // What the optimizer steps and checkpoints hold: FSDP's shards, or the model's whole groups;
  // and their cut (count 1: whole).
  std::vector<ParamGroup>& state_groups();
  Shard state_cut() const;
  // The ranks the gradient norm is reduced over: FSDP's shard group, or none (whole gradients);
  // and under TP or EP the TP or EP group, over which the cut parameters' squares are summed
  // (none under FSDP x EP, whose shard group holds every expert's shards once).
  Communicator* grad_norm_group();
  CutModelNorm cut_model_norm();
  // What a step's scored tokens and losses are summed over: the data-parallel ranks with this
  // rank's tp index (the TP ranks of a group compute the same).
  Communicator& data_parallel_group() { return mesh_.dp_group(); }
  // What the load-balancing loss's router statistics are summed over when it is global
  // (model.router_aux_loss_scope): the ranks holding the other tokens of a micro-batch step, the
  // data-parallel ranks of this tp index (EP's ranks among them). Under EP x TP each TP rank
  // routes its sequence shard, and the model sums those statistics over the TP group first
  // (DecoderLM::reduce_router_statistics), so the data-parallel ranks complete the sum.
  Communicator& router_statistics_group() { return mesh_.dp_group(); }

  // HF init of every parameter, deterministic in `seed` (a unit at a time under FSDP); under TP
  // and EP each rank's cut of the whole model's values. Not for a base held in bf16.
  void initialize(const ModelArgs& args, uint64_t seed);
  // Before a merged export of a base held in bf16: its fp32 masters made again from its bf16
  // values, widened exactly (FSDP: FullyShardedGroups::widen_bf16_shards; else the model's,
  // widen_lora_base_to_fp32), so the export scans, gathers and merges fp32 weights.
  void widen_bf16_base();
  // Before a step's first backward, and after its last: the data-parallel reduction of the
  // gradients (FSDP's reduce-scatters finished, or DDP's all-reduce; under EP the experts' over
  // the ranks holding the same experts).
  void zero_gradients();
  void finish_gradients();
  // Whether this rank writes its cut of a checkpoint: one writer per distinct cut (rank 0 for
  // whole parameters, replica 0's shard ranks under FSDP and HSDP; rank 0 under TP and EP, FSDP x
  // EP included, which writes the gathered whole).
  bool writes_checkpoint() const;
  // What a checkpoint writer writes (`groups`: the state groups' own buffers; under TP or EP rank
  // 0's whole groups, the other ranks get none) and, under TP or EP, how each tensor comes to be
  // there: gathered whole onto rank 0 from the TP or EP group's cuts (under FSDP each cut's rows
  // gathered first). Synchronous (`all_now` false): by `gather`, which every rank taking part
  // calls for each tensor of checkpoint_read_order -- rank 0 as the writer's before_read, so it
  // holds one tensor whole at a time, the one before handed back -- and end_checkpoint after;
  // null on the other ranks and without TP and EP. Asynchronous (`all_now`): every tensor
  // gathered now into a whole copy rank 0 keeps until the next save (the save's staging copy),
  // `gather` null. Every rank calls it for every save.
  struct CheckpointSource {
    std::vector<CheckpointGroup> groups;
    CheckpointBeforeRead gather;
  };
  CheckpointSource checkpoint_source(bool model_only, bool all_now);
  // After a synchronous save: the last tensor gathered handed back.
  void end_checkpoint();
  // Whether checkpoint_source gathers (TP or EP).
  bool gathers_checkpoint() const { return cuts_; }
  // The cut checkpoints are written in: state_cut(), or whole under TP and EP.
  Shard checkpoint_cut() const;
  // The model's weights scanned for NaN and Inf where this rank holds them (FSDP: its shards,
  // the counts summed over the shard group), `what` naming them: the same scan on every rank.
  NonfiniteScan scan_model(const std::string& what);
  // The same for train_only's groups (under TP a cut parameter's counts summed over the group).
  NonfiniteScan scan_trained(const std::string& what);
  // One parameter `name` of train_only's group `group`, whole into `whole` on rank 0 (null
  // elsewhere): under TP its cuts gathered, else rank 0's copied. Every rank calls it, for the
  // same parameters in the same order (the PEFT adapter's writer's: models/peft_adapter.h).
  void gather_trained(size_t group, const std::string& name, float* whole);
  // Whether this rank takes part in the export's gathers (every rank of replica 0's shard groups
  // under FSDP; the TP or EP group of rank 0 under TP or EP; rank 0, which writes, else).
  bool takes_part_in_export() const;
  // The groups the export reads on rank 0: the model's own, or under TP and EP whole ones made for
  // it (model_param_specs, released until gather_for_export fills a run).
  std::vector<ParamGroup>& export_groups();
  // Before the export reads a run (models/hf_export.h): its parameters whole in export_groups()
  // on rank 0, which writes them -- under FSDP gathered from the shards, under TP or EP from the
  // TP or EP ranks' cuts, the previous run handed back, so the export holds one unit at most beside
  // the shards; else already there. Every rank that takes part calls it for every run, in order;
  // end_export hands the last run back.
  void gather_for_export(const ExportRun& run);
  void end_export();

 private:
  // The group a cut parameter's cuts lie over: an expert's EP group, else the TP group.
  Communicator& cut_group_of(const ParamSpec& p);
  // Where a parameter's squares and non-finite counts are summed past FSDP's shard group: its cut
  // group, the TP group for an expert under FSDP x EP x TP (the shard group holds whole the
  // experts of this tp index's EP indices), none for a replicated one (counted once) or an
  // expert under FSDP x EP without TP (shards_span_cuts).
  Communicator* sum_group_of(const ParamSpec& p);
  // Whether the FSDP shard group holds every EP rank's experts (FSDP x EP without TP: the EP
  // group and the ranks holding the same experts both lie within dp_shard), so a sum over it
  // counts each expert's elements once and no sum over the cut group follows.
  bool shards_span_cuts() const;
  // scan_model's count of `groups` (`sharded`: FSDP's shards, counts summed over the shard group).
  NonfiniteScan scan_groups(std::vector<ParamGroup>& groups, bool sharded, const std::string& what);
  // Whether `v` is one of a sparse layer's stacked experts (the plan's expert style).
  bool is_expert(const ParamSpec& p) const;
  // The TP or EP gather of `run` from the model's groups (whole over FSDP on each TP rank) into
  // export_groups() on rank 0.
  void gather_cuts(const ExportRun& run);
  // One parameter's cuts (`local`'s view v, this rank's at `own`) gathered whole into `whole`
  // on the cut group's rank 0 (null elsewhere).
  void gather_cut_param(const ParamView& v, float* own, float* whole);
  // One tensor of a checkpoint gathered whole into `whole` on rank 0 (null elsewhere): under FSDP
  // the rows onto rank 0's TP or EP group first. Every rank of replica 0 calls it (without FSDP
  // only those of rank 0's TP or EP group).
  void gather_checkpoint_tensor(const CheckpointTensor& t, float* whole);

  CausalLM& model_;
  DeviceMesh& mesh_;
  ParallelizePlan plan_;
  bool cuts_;  // the plan cuts parameters: TP or EP
  // Under TP or EP, rank 0's whole checkpoint state: per group its parameters and AdamW moments
  // (made released; a synchronous save commits one tensor's bytes at a time, `streamed_`).
  std::vector<std::array<Buffer, 3>> checkpoint_whole_;
  Buffer* streamed_ = nullptr;
  std::vector<ParamGroup> export_whole_;      // under TP or EP: the export's whole groups (rank 0)
  std::unique_ptr<FullyShardedGroups> fsdp_;  // with data_parallel_shard_degree > 1
  std::vector<ParamGroup>* trained_ = nullptr;  // train_only's groups
  std::vector<ParamGroupSpec> trained_whole_;   // and their whole specs
  // Under TP or EP on rank 0: the whole groups a checkpoint of train_only's groups is laid out in
  // (made released, never committed: checkpoint_whole_ holds the bytes).
  std::vector<ParamGroup> trained_layout_;
  // What a checkpoint holds whole (the trained groups' or the model's) and its groups on rank 0
  // under TP or EP; the groups this rank's cut of each is in.
  std::vector<ParamGroupSpec> checkpoint_specs() const;
  std::vector<ParamGroup>& checkpoint_layout();
  std::vector<ParamGroup>& local_state_groups();
  bool base_in_bf16_ = false;
};

}  // namespace titan
