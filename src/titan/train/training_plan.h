// What a training job will take on each rank, from its config alone -- nothing read, nothing
// allocated (`titan plan`): the bytes the trainer's accounted allocator (core/allocator.h) will
// hold in each category at the run's peak, the FLOPs of a step and the bytes each rank sends in
// a step's collectives. Every figure follows what the trainer allocates and what distributed/
// moves; tests/unit/test_training_plan.cpp checks the bytes against the real buffers.
//
// Per rank (P: the model's parameter buffers, 4 bytes a float, each parameter padded to 16
// floats; under FSDP over N ranks each parameter's shard has ceil(d0 / N) rows -- under FSDP x EP
// an expert's over the N x tp / ep ranks holding the same experts, of the rank's E / ep experts
// -- and the unit of a group is its whole buffers, under TP and EP the rank's cuts and experts of
// it):
//   parameters  P (+ the bf16 copies of the matmul weights with mixed precision), or under FSDP
//               the shards + the whole parameters in flight: a unit's masters and, under bf16,
//               its bf16 copies instead of the masters of the weights gathered in bf16 (or
//               start-up's one whole fp32 unit, when more)
//   gradients   the shards + the whole gradients in flight
//   optimizer   2 x the parameters (AdamW's two moments; shards under FSDP)
//   activations the model's arena for (local_batch_size, seq_len) -- every layer's saved
//               tensors; with activation checkpointing one set for the layers it recomputes
//               (full: all, selective "N": every N-th), or under selective "op" (and a LoRA
//               run's none) every layer's without its norms' outputs -- and the scratch the
//               layers share, which the lm_head loss's logits chunk reuses
//   other       the RoPE cos/sin tables for seq_len; under FSDP the collectives' staging (N x the
//               largest shard), one reduced-gradient shard and under bf16 the send buffer of the
//               largest bf16 gather block; while a file is written, the writer's staging
// With LoRA (one process, DDP or FSDP; fp32 or bf16) the model's parameters are frozen: gradients
// and AdamW moments exist only for the adapter's, which are added to the parameters; DDP
// all-reduces the adapter's gradients. (The LoRA products' own scratch, two (N, rank) fp32 arrays
// and one B^T, is outside the accounted categories.) Under FSDP with bf16 the all-gathers move the
// bf16-only weights' rows in bf16 (DecoderLM::read_only_in_bf16), the rest in fp32; the
// reduce-scatters move fp32 gradients.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/distributed/comm_counts.h"
#include "titan/distributed/mesh.h"
#include "titan/models/lora.h"
#include "titan/models/model_args.h"
#include "titan/train/job_config.h"

namespace titan {

struct LmHeadLossKernel;  // dispatch/registry.h

// What the plan depends on, as the trainer resolves it from a JobConfig (plan_inputs).
struct PlanInputs {
  ModelArgs args;
  MeshDims mesh;
  bool sequence_parallel = false;      // parallelism.enable_sequence_parallel, under TP
  bool router_aux_loss_global = true;  // model.router_aux_loss_scope = "global"
  int64_t local_batch_size = 1, seq_len = 1;
  int64_t accumulation_steps = 1;  // micro-batches per rank per step
  DType compute_dtype = DType::f32;
  ActivationCheckpointing checkpointing;          // [activation_checkpoint]
  std::string reshard_after_forward = "default";  // parallelism.fsdp_reshard_after_forward
  bool checkpoint_saves = false;                  // checkpoint.enable
  bool export_hf = false;                         // checkpoint.last_save_in_hf
  // What the export writes: the model (a LoRA run's merged with lora.merge_on_export) or only a
  // LoRA adapter (no model weights gathered); its checkpoint.export_dtype.
  bool export_model_weights = true;
  DType export_dtype = DType::bf16;
  // [lora]: rank 0, or the adapter a LoRA run trains (the model's weights then frozen).
  LoraOptions lora;
  // lora.base_dtype = "bfloat16": the frozen base's matmul weights held only in bf16 (one process
  // or replicas: the model's copies; FSDP: its shards; train/lora_job.h).
  bool lora_base_bf16 = false;
  // [overrides] rules that match no module, as titan train warns of them.
  std::vector<std::string> override_warnings;
  // The loss kernel [overrides] or a plugin binds to lm_head: its workspace and chunks (null: the
  // device's default).
  const LmHeadLossKernel* lm_head_loss = nullptr;
};

// The inputs of `config` on a world of `world_size` ranks: the same resolution and the same
// one-line errors as `titan train` (train/job_resolve.h), without reading the tokenizer or data.
PlanInputs plan_inputs(const JobConfig& config, int64_t world_size);

// Bytes on one rank. The resident figures are held from the first step to the end; the others
// only at their moment.
struct MemoryPlan {
  // Resident: the parameters (FSDP: this rank's shards) and, in one process under bf16, the
  // compute copies of the [norm, lm_head] unit's matmul weights; the gradients, AdamW's moments.
  int64_t parameters = 0, compute_copies = 0, gradients = 0, optimizer = 0;
  // One process under bf16: the room every block's compute copies are made in at each of its uses
  // (the largest block's; DecoderLM::acquire), held from the first block's use on.
  int64_t block_copies = 0;
  // FSDP: the most whole parameters (under bf16: fp32-read masters and bf16 copies; start-up's
  // whole fp32 unit when more; a prefetched unit's from its prefetch) and whole gradients (a
  // unit's until its reduce-scatter is summed in) in flight at once -- each category's peak --
  // and the most of both together (the step's moment: a unit's backward beside the next one
  // gathering and the last one reducing, or the final norm and loss beside units kept after their
  // forward, fsdp_reshard_after_forward); the collectives' own buffers (the reduced gradient
  // shard, under bf16 the rounded rows a rank sends). 0 in one process.
  int64_t unit_parameters = 0, unit_gradients = 0, units_in_flight = 0, collective_buffers = 0;
  // Activations under activation checkpointing none and full, and under the config's mode.
  int64_t activations_none = 0, activations_full = 0, activations = 0;
  // Under expert parallel, the part of `activations` that is the rooms for the rows arriving at
  // this rank's experts, sized for the most that can arrive in a micro-batch
  // (expert_parallel_rows, nn/expert_parallel.h most_arrived_rows); 0 otherwise.
  int64_t expert_parallel_rooms = 0, expert_parallel_rows = 0;
  int64_t rope = 0;  // the RoPE tables
  // While a checkpoint or the final Hugging Face folder is written: the writer's staging; under
  // FSDP rank 0 also holds the export's largest run of one unit's whole parameters (gathered to
  // it a run at a time: models/hf_export.h ExportRun), at most one unit, under TP the same run of
  // whole parameters beside its cut ones and the rank-ordered cuts of its largest row-wise
  // parameter (gathered before being placed), under FSDP x TP or EP a run of the rank's part
  // gathered from the shards beside the whole run of it or of the run before (handed back once
  // the next part has come); over a LoRA base held in
  // bf16 the merged export's widened fp32 masters of its matmul weights, every group's.
  int64_t writer_staging = 0, export_gather = 0;
  // Tensor or expert parallel with checkpoint.enable: while a synchronous save is written, rank
  // 0's one tensor gathered whole (and a row-wise parameter's cuts before they are placed; under
  // FSDP x TP, FSDP x EP or FSDP x TP x EP also rank 0's part of it, gathered from the shards
  // first). An asynchronous save's copy of the whole state is not counted, as no staging copy is.
  int64_t checkpoint_gather = 0;
  // LoRA: the adapter's parameters (within `parameters`; gradients and optimizer are then the
  // adapter's alone), and the gradient and AdamW bytes full fine-tuning would hold beyond them.
  int64_t lora_parameters = 0, lora_saved = 0;
  // LoRA on a MoE's experts: the merged weights and their gradients (and under bf16 the merged
  // weights rounded), one sparse layer's worth shared by all (nn/lora.h ExpertLoraScratch), made
  // at the first step's forward and held on; and with lora.dropout the rooms of the masked input
  // (nn/lora.h LoraScratch: a micro-batch's tokens x the widest adapted input x 10 bytes).
  int64_t lora_scratch = 0;

  // During a step: per category its peak; in all, resident + units_in_flight + activations.
  std::array<int64_t, kMemCategoryCount> step_by_category() const;
  int64_t step_peak() const;
  int64_t between_steps() const;    // resident: the step's peak without the units in flight
  int64_t checkpoint_peak() const;  // resident + the writer's staging + one tensor gathered
  int64_t export_peak() const;      // resident + one run gathered whole + the staging
};

// One line of a step's communication on one rank, as the communicators count it
// (distributed/comm_counts.h): the mesh's group (DeviceMesh::named_groups: "dp", "dp_shard",
// "dp_replicate", "tp", "ep", "same_experts", "expert_shard"), the collective, its calls and bytes
// per step, and what moves.
struct CommRow {
  std::string group;
  Collective collective = Collective::all_reduce;
  int64_t calls = 0, bytes = 0;
  std::string what;
};

// Bytes one rank sends (and receives) in a step's collectives, ring algorithms: an all-gather or
// a reduce-scatter of M bytes over N ranks moves (N - 1) / N x M per rank, an all-reduce twice
// that. The scalars (loss sums, the gradient norm) are left out.
struct CommPlan {
  // FSDP, per micro-batch (each micro-batch gathers every unit again): the all-gathers of the
  // forward (each unit once; a tied embedding unit twice, for the embedding and for the final norm
  // and loss, unless kept between) and of the backward (each block not kept since its forward; the
  // embedding unit), the reduce-scatters of the gradients (each unit once; a tied embedding unit
  // twice).
  int64_t all_gather_forward = 0, all_gather_backward = 0, reduce_scatter = 0;
  // Once per step: HSDP's all-reduce of the shards' gradients over the replicas, or DDP's of the
  // whole gradients.
  int64_t all_reduce = 0;
  int64_t micro_batches = 1;
  // Every collective of a step by group (the scalars too), per step: what the trainer's
  // end-of-run report measures (train/comm_report.h), equal where routing plays no part.
  std::vector<CommRow> rows;
  int64_t per_step() const {
    return micro_batches * (all_gather_forward + all_gather_backward + reduce_scatter) + all_reduce;
  }
};

struct TrainingPlan {
  PlanInputs inputs;
  int64_t parameter_count = 0;  // count_parameters(args).total
  MemoryPlan memory;
  CommPlan comm;
  double flops_per_token =
      0.0;  // models/flops.h: this rank's share (the MFU numerator; no recompute)
  double flops_per_step_rank = 0.0;  // x the tokens one rank runs in a step
  int64_t tokens_per_step = 0;       // the global batch's
  // The run's highest figure: the step's, or the checkpoint's or the export's when the config
  // writes them and they are higher.
  int64_t peak() const;
};

TrainingPlan plan_training(const PlanInputs& inputs);

// Expert parallel's all-to-all-v's over its group (nn/layers.h SparseMoeBlock) in a step of
// `micro_batches` on one rank: per sparse layer and micro-batch the forward's three -- the
// per-expert row counts (i32), the routed rows' inputs to their experts' ranks (bf16 under bf16
// compute), their outputs back -- again for a layer activation checkpointing recomputes, and the
// backward's five (the output gradients and routing weights out, the inputs again, the input
// gradients and the weight gradients back, fp32). `rows_out`: a micro-batch's routed rows (token
// x top-k) per sparse layer this rank sends to the other ranks; `rows_in`: those the others send
// it (and it returns). The calls are exact; the bytes follow the rows.
CommRow expert_parallel_row(const ModelArgs& args, int64_t ep, int64_t micro_batches,
                            DType compute_dtype, const ActivationCheckpointing& checkpointing,
                            double rows_out, double rows_in);
// A micro-batch's routed rows per sparse layer that leave a rank of `ep` under uniform routing
// (each of tokens x top_k rows on another rank's experts with probability (ep - 1) / ep): the
// expectation `titan plan` prints, for rows_out and rows_in alike.
double uniform_routed_rows(const ModelArgs& args, int64_t ep, int64_t tokens);

}  // namespace titan
