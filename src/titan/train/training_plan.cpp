#include "titan/train/training_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/registry.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/flops.h"
#include "titan/models/hf_export.h"
#include "titan/models/parallelize.h"
#include "titan/models/param_count.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/expert_parallel.h"
#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"
#include "titan/train/job_resolve.h"
#include "titan/train/lora_job.h"
#include "titan/train/parallelism.h"

namespace titan {
namespace {

constexpr int64_t kFloat = sizeof(float);

// Bytes each rank sends in a ring all-gather or reduce-scatter whose whole side is
// `ranks` x `shard_bytes`.
int64_t ring_bytes(int64_t ranks, int64_t shard_bytes) {
  return (ranks - 1) * shard_bytes;
}

// The two groups FSDP queues a unit's collectives over (FullyShardedGroups' kinds of views): the
// shard group, and under FSDP x EP the experts' (the mesh's "expert_shard").
enum ShardKind : size_t { kRestShards = 0, kExpertShards = 1 };

constexpr int64_t kDouble = sizeof(double);

// Whether `p` is one of a sparse layer's stacked experts (the plan's expert style; under EP x TP
// the TP cuts are cut too).
bool is_expert(const ParallelizePlan& plan, const ParamSpec& p) {
  return plan.style_of(module_of_param(p.name)) == ParallelStyle::expert;
}

// The data-parallel reduction of a step's gradients (Parallelism::finish_gradients) and the
// step's scalars (Trainer::train_step: the scored tokens, the loss sums; the gradient norm's
// squares, optimizer.cpp), as rows of CommPlan.
// What all_reduce_gradients with a selection sends for `groups`: one call per run of selected
// parameters with no other between them, its bytes the run's span of the group's buffer (the
// views' alignment padding between them included).
struct GradientRuns {
  int64_t calls = 0, bytes = 0;
};

GradientRuns gradient_runs(const std::vector<ParamGroupSpec>& groups,
                           const std::function<bool(const ParamSpec&)>& which) {
  GradientRuns runs;
  for (const ParamGroupSpec& g : groups) {
    int64_t offset = 0, begin = 0, end = 0;  // floats into the group's buffer
    bool open = false;
    const auto close = [&] {
      if (open) {
        ++runs.calls;
        runs.bytes += (end - begin) * kFloat;
      }
      open = false;
    };
    for (const ParamSpec& p : g.params) {
      const int64_t numel = shape_numel(p.shape);
      if (which(p)) {
        if (!open) begin = offset;
        open = true;
        end = offset + numel;
      } else {
        close();
      }
      offset += param_view_span(numel);
    }
    close();
  }
  return runs;
}

void append_gradient_rows(const PlanInputs& in, const std::vector<ParamGroupSpec>& group_specs,
                          const ParallelizePlan& parallelize,
                          const std::vector<int64_t>& shard_numel, std::vector<CommRow>& rows) {
  const bool lora = in.lora.rank > 0, fsdp = in.mesh.fsdp();
  const int64_t dp = in.mesh.dp();
  if (in.mesh.ep > 1 && !lora && !fsdp) {
    // Whole on every rank but for the experts (EP over all of dp_shard): the others' gradients over
    // every data-parallel rank, the experts' over the ranks holding the same experts, one
    // all-reduce per run of either in a group's buffer (all_reduce_gradients with a selection).
    const auto expert = [&](const ParamSpec& p) { return is_expert(parallelize, p); };
    const GradientRuns others =
        gradient_runs(group_specs, [&](const ParamSpec& p) { return !expert(p); });
    if (dp > 1) {  // under EP x TP the data-parallel ranks may be one
      rows.push_back({"dp", Collective::all_reduce, others.calls, others.bytes,
                      "the gradients but the experts', one call per run of them in a group"});
    }
    if (in.mesh.dp_replicate > 1) {
      const GradientRuns experts = gradient_runs(group_specs, expert);
      rows.push_back({"same_experts", Collective::all_reduce, experts.calls, experts.bytes,
                      "the experts' gradients over the ranks holding them, one call per run"});
    }
  } else if (dp > 1 && (lora || !fsdp)) {
    // The trained groups whole on every rank (DDP, or a LoRA adapter): one all-reduce each.
    int64_t calls = 0, bytes = 0;
    for (const ParamGroupSpec& g : lora ? lora_param_specs(in.args, in.lora) : group_specs) {
      ++calls;
      bytes += param_group_numel(g.params) * kFloat;
    }
    rows.push_back({"dp", Collective::all_reduce, calls, bytes,
                    lora ? "the LoRA adapter's gradients, one call per group"
                         : "DDP: the gradients, one call per group"});
  } else if (fsdp && in.mesh.dp_replicate > 1) {
    int64_t bytes = 0;
    for (const int64_t shard : shard_numel) bytes += shard * kFloat;
    rows.push_back({"dp_replicate", Collective::all_reduce,
                    static_cast<int64_t>(shard_numel.size()), bytes,
                    in.mesh.ep > 1 ? "HSDP x EP: the shards' gradients over the replicas (the "
                                     "experts' rows with the rest), one call per unit"
                                   : "HSDP: the shards' gradients over the replicas, one call per "
                                     "unit"});
  }
  if (fsdp && !lora) {
    rows.push_back(
        {"dp_shard", Collective::all_reduce, 1, kDouble, "the gradient norm's sum of squares"});
  }
  // Under FSDP x EP the shard group holds every expert's rows once (Parallelism::
  // shards_span_cuts): no sum over the EP group follows.
  // (Parallelism::cut_model_norm: the TP cuts' -- under FSDP x EP x TP the experts' too -- over
  // the TP group; without FSDP the experts' over the EP group.)
  if (in.mesh.tp > 1) {
    rows.push_back({"tp", Collective::all_reduce, 1, kDouble,
                    "the gradient norm's sum of squares of the cut parameters"});
  }
  if (in.mesh.ep > 1 && !fsdp) {
    rows.push_back({"ep", Collective::all_reduce, 1, kDouble,
                    "the gradient norm's sum of squares of the experts"});
  }
  if (dp > 1) {
    rows.push_back({"dp", Collective::all_reduce, 2, 3 * kDouble,
                    "the step's scored tokens, then its loss sums"});
  }
  bool sparse = false;
  for (int64_t i = 0; i < in.args.num_hidden_layers; ++i) sparse |= in.args.layer_is_sparse(i);
  if (dp > 1 && in.router_aux_loss_global && in.args.output_router_logits && sparse) {
    // DecoderLM::forward: the global load-balancing loss's statistics, 2 E + 1 doubles.
    const int64_t mb = in.accumulation_steps;
    rows.push_back({"dp", Collective::all_reduce, mb, mb * (2 * in.args.num_experts + 1) * kDouble,
                    "the load-balancing loss's router statistics, once per micro-batch"});
  }
}

// Tensor parallel's collectives over the TP group, per step (models/decoder_lm.cpp, nn/
// decoder_layer.cpp): without sequence parallel an all-reduce of the (tokens, hidden) partial
// sums after each row-parallel block (the attention's o_proj, the MLP's down_proj, and the
// vocabulary-parallel embedding) in the forward and after each column-parallel block's input
// gradient in the backward (the lm_head loss's d x too); with sequence parallel an all-gather of
// the block input before each column-parallel block (and the output gradient before each
// row-parallel one in the backward) and a reduce-scatter in place of each all-reduce. A layer
// recomputed under activation checkpointing runs its forward's again. Under EP x TP a sparse
// layer's MLP is no TP block: its sparse block runs on the rank's sequence shard, under sequence
// parallel on the rows the stream holds (nothing moved around it), without it on a slice of the
// whole input, its output -- and in the backward its input gradient -- all-gathered whole; without
// EP (expert tensor parallel) it is a TP block as the dense MLP is, the router's input whole. The
// vocabulary-parallel loss reduces, per chunk of tokens, the max (as doubles) and then the sum of
// exponentials and the target logit (floats) of each token; replicated parameters whose gradient
// is each rank's part (q/k norms on the local heads, under sequence parallel the layers' and the
// final norm, the routers: under EP x TP on the rank's tokens, under expert tensor parallel on its
// experts' partial outputs) all-reduce their weight gradients, and under EP x TP the
// load-balancing statistics of the rank's tokens are summed over the group (under expert tensor
// parallel every rank's are the whole rows').
void append_tensor_parallel_rows(const PlanInputs& in, std::vector<CommRow>& rows) {
  const ModelArgs& a = in.args;
  const int64_t mb = in.accumulation_steps, n = in.local_batch_size * in.seq_len;
  const int64_t stream = n * a.hidden_size * kFloat;  // the residual stream's whole
  const int64_t layers = a.num_hidden_layers;
  // TP blocks per layer (the attention, and a dense layer's MLP or under expert tensor parallel a
  // sparse one's), run in the forward (recomputed: twice) and the backward; the sparse layers on
  // sequence shards (EP x TP), likewise.
  const bool on_shards = in.mesh.ep > 1;
  int64_t forward_blocks = 0, backward_blocks = 0, sparse_forward = 0, sparse_layers = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const bool sparse = a.layer_is_sparse(i);
    const int64_t runs = in.checkpointing.recomputes_layer(i) ? 2 : 1;
    const int64_t blocks = sparse && on_shards ? 1 : 2;
    forward_blocks += blocks * runs;
    backward_blocks += blocks;
    sparse_forward += sparse ? runs : 0;
    sparse_layers += sparse ? 1 : 0;
  }
  const bool sp = in.sequence_parallel;
  const int64_t chunk = bound_lm_head_loss(in.lm_head_loss).chunk_tokens(n, a.vocab_size, 0);
  const int64_t chunks = (n + chunk - 1) / chunk;
  // Per micro-batch: the stream's reductions (embedding, each block forward and recomputed and
  // backward, the loss's d x) and gathers.
  const int64_t reductions = 1 + forward_blocks + backward_blocks + 1;
  if (sp) {
    // Gathers: one per block forward and recomputed, two per block backward (the norm's output
    // again, and the output gradient), the final norm's output, the embedding's gradient.
    const int64_t gathers = forward_blocks + 2 * backward_blocks + 2;
    rows.push_back({"tp", Collective::all_gather, mb * gathers, mb * gathers * stream,
                    "SP: each column-parallel block's input, each row-parallel block's output "
                    "gradient, the final norm's output and the embedding's gradient"});
    rows.push_back({"tp", Collective::reduce_scatter, mb * reductions, mb * reductions * stream,
                    "SP: each row-parallel block's output, each column-parallel block's input "
                    "gradient, the embedding's output and the loss's d x"});
  } else {
    rows.push_back({"tp", Collective::all_reduce, mb * reductions, mb * reductions * stream,
                    "each row-parallel block's output, each column-parallel block's input "
                    "gradient, the embedding's output and the loss's d x"});
    if (sparse_layers > 0 && on_shards) {
      const int64_t gathers = sparse_forward + sparse_layers;
      rows.push_back({"tp", Collective::all_gather, mb * gathers, mb * gathers * stream,
                      "EP x TP: each sparse block's output (forward and recomputed) and input "
                      "gradient, from the ranks' sequence shards"});
    }
  }
  rows.push_back({"tp", Collective::all_reduce, mb * 2 * chunks,
                  mb * (n * kDouble + 2 * n * kFloat),
                  "the vocabulary-parallel loss: per chunk of " + std::to_string(chunk) +
                      " tokens the max, then the sum of exponentials and the target logit"});
  const int64_t routers = a.is_moe() ? sparse_layers : 0;
  const int64_t norms = (a.qk_norm ? 2 : 0) * layers + (sp ? 2 * layers + 1 : 0) + routers;
  if (norms > 0 && in.lora.rank == 0) {
    const int64_t bytes = (a.qk_norm ? 2 * layers * a.head_dim : 0) +
                          (sp ? (2 * layers + 1) * a.hidden_size : 0) +
                          routers * a.num_experts * a.hidden_size;
    std::string what = a.qk_norm ? "the q/k norms' weight gradients (local heads)" : "";
    const auto add = [&what](const char* more) {
      what += (what.empty() ? "" : ", ") + std::string(more);
    };
    if (sp) add("the layers' and the final norm's weight gradients (SP)");
    if (routers > 0) {
      add(on_shards ? "each router's weight gradient (EP x TP: the rank's tokens)"
                    : "each router's weight gradient (the rank's experts' partial outputs)");
    }
    rows.push_back({"tp", Collective::all_reduce, mb * norms, mb * bytes * kFloat, what});
  }
  if (routers > 0 && on_shards && a.output_router_logits) {
    // DecoderLM::reduce_router_statistics: the expert counts and probability sums, 2 E doubles.
    rows.push_back({"tp", Collective::all_reduce, mb, mb * 2 * a.num_experts * kDouble,
                    "EP x TP: the load-balancing loss's router statistics of the ranks' shards, "
                    "once per micro-batch"});
  }
}

}  // namespace

PlanInputs plan_inputs(const JobConfig& config, int64_t world_size) {
  PlanInputs in;
  check_tensor_parallel_job(config);  // before the mesh, as titan train
  in.mesh = resolve_mesh_dims(job_parallel_degrees(config), world_size);
  in.accumulation_steps = job_accumulation_steps(config, in.mesh);
  in.sequence_parallel = in.mesh.tp > 1 && config.parallelism.enable_sequence_parallel;
  in.router_aux_loss_global = config.model.router_aux_loss_scope == "global";
  in.args = resolve_job_model_args(config);
  check_job_sizes(config, in.args, in.mesh);
  // What is planned under TP and EP is what is built: titan train's config-only refusals.
  check_expert_parallel_job(config, in.mesh);
  check_tensor_parallel_model(config, in.args, in.mesh);
  in.local_batch_size = config.training.local_batch_size;
  in.seq_len = config.training.seq_len;
  in.compute_dtype = job_compute_dtype(config);
  in.checkpointing = job_activation_checkpointing(config);
  in.reshard_after_forward = config.parallelism.fsdp_reshard_after_forward;
  in.checkpoint_saves = config.checkpoint.enable;
  in.export_hf = config.checkpoint.last_save_in_hf;
  in.export_model_weights = config.lora.rank == 0 || config.lora.merge_on_export;
  in.export_dtype = parse_export_dtype(config.checkpoint.export_dtype);
  if (config.lora.rank > 0) {
    TITAN_CHECK(in.mesh.tp == 1 && in.mesh.ep == 1, "lora.rank ", config.lora.rank,
                in.mesh.tp > 1 ? " under parallelism.tensor_parallel_degree "
                               : " under parallelism.expert_parallel_degree ",
                in.mesh.tp > 1 ? in.mesh.tp : in.mesh.ep,
                ": LoRA under tensor or expert parallel is not planned yet (titan train runs it)");
    check_lora_config(config);
    in.lora = job_lora_options(config);
    check_lora_base_dtype(config, in.args);
    in.lora_base_bf16 = lora_base_in_bf16(config);
  }
  // The kernels [overrides] names, a plugin's too, and their constraints on the step's shapes, as
  // titan train refuses them before allocating.
  const DecoderLMOverrides bound =
      decoder_lm_overrides(in.args, resolve_job_kernels(config).overrides, in.compute_dtype,
                           in.local_batch_size, in.seq_len);
  if (in.mesh.tp > 1) require_vocab_parallel_loss(*bound.lm_head_loss);
  in.override_warnings = bound.report.warnings;
  in.lm_head_loss = &std::get<LmHeadLossKernel>(bound.lm_head_loss->impl);
  return in;
}

std::array<int64_t, kMemCategoryCount> MemoryPlan::step_by_category() const {
  std::array<int64_t, kMemCategoryCount> c{};
  c[static_cast<int>(MemCategory::parameters)] =
      parameters + compute_copies + block_copies + unit_parameters;
  c[static_cast<int>(MemCategory::gradients)] = gradients + unit_gradients;
  c[static_cast<int>(MemCategory::optimizer)] = optimizer;
  c[static_cast<int>(MemCategory::activations)] = activations;
  c[static_cast<int>(MemCategory::other)] = rope + collective_buffers + lora_scratch;
  return c;
}

int64_t MemoryPlan::step_peak() const {
  int64_t total = units_in_flight;
  for (const int64_t bytes : step_by_category()) total += bytes;
  return total - unit_parameters - unit_gradients;
}

int64_t MemoryPlan::between_steps() const {
  return step_peak() - units_in_flight;
}

int64_t MemoryPlan::checkpoint_peak() const {
  return between_steps() + writer_staging + checkpoint_gather;
}

int64_t MemoryPlan::export_peak() const {
  return between_steps() + writer_staging + export_gather;
}

int64_t TrainingPlan::peak() const {
  int64_t peak = memory.step_peak();
  if (inputs.checkpoint_saves) peak = std::max(peak, memory.checkpoint_peak());
  if (inputs.export_hf) peak = std::max(peak, memory.export_peak());
  return peak;
}

TrainingPlan plan_training(const PlanInputs& in) {
  TrainingPlan plan;
  plan.inputs = in;
  const ModelArgs& a = in.args;
  plan.parameter_count = count_parameters(a).total;
  const int64_t n = in.mesh.dp_shard;
  const bool fsdp = in.mesh.fsdp();
  // LoRA freezes the model: its units have no gradients, in flight or sharded.
  const bool frozen = in.lora.rank > 0;

  // Floats per rank of each group's buffers (FSDP: its shard) and of the largest whole group;
  // per group, for a use reading parameters [0] and one reading through_copies [1] (GroupReads),
  // its fp32 masters and the elements of its bf16 copies (DecoderLM::allocate_compute_weights: the
  // weights read only in bf16, and a tied embedding's lm_head copy, which [1] reads) and under FSDP
  // the bytes a ring all-gather sends from this rank's rows (FullyShardedGroups::start_gather;
  // rank 0 holds the most rows), and the most bf16 rows one gather rounds into the send buffer.
  const bool bf16 = in.compute_dtype == DType::bf16;
  int64_t resident = 0, largest_whole = 0, largest_shard = 0, largest_send = 0;
  std::vector<int64_t> shard_numel, whole_numel;
  // A base held in bf16 (lora.base_dtype): the weights read only in bf16 are never fp32 masters.
  // Per group (FSDP: its shard), the fp32 masters of the rest and the elements held in bf16.
  const auto held_in_bf16 = [&](const std::string& name) {
    return in.lora_base_bf16 && DecoderLM::read_only_in_bf16(name);
  };
  std::vector<int64_t> base_master_numel, base_bf16_numel;
  std::array<std::vector<int64_t>, 2> gather_bytes, master_numel, copy_numel;
  // Per group: the whole side of its all-gather for each kind of use, and of its reduce-scatter
  // (every rank's rows: what the communicator counts, distributed/comm_counts.h), per group of
  // ranks it runs over (ShardKind; 0: the unit has no view of that kind, so no call); the bytes a
  // ring reduce-scatter sends from this rank.
  using PerShardKind = std::array<int64_t, 2>;
  std::array<std::vector<PerShardKind>, 2> gather_whole_bytes;
  std::vector<PerShardKind> scatter_whole_bytes;
  std::vector<int64_t> scatter_bytes;
  // Rank 0's parts of the parameters, as its model is built (Parallelism::plan; the TP and EP
  // ranks' parts are the same sizes: each EP rank's num_experts / ep experts).
  ParallelAxes axes;
  axes.tp_degree = in.mesh.tp;
  axes.ep_degree = in.mesh.ep;
  axes.sequence_parallel = in.sequence_parallel;
  const ParallelizePlan parallelize = Parallelism::plan(a, axes);
  const std::vector<ParamGroupSpec> group_specs = local_param_specs(a, parallelize);
  // Rank 0's FSDP cut of each parameter (distributed/fsdp.h): its dim 0 cut to ceil(d0 / N) rows
  // over the shard group's N ranks -- under FSDP x EP an expert's over the dp_shard x tp / ep
  // ranks holding the same experts (ParallelizePlan::fsdp_cut_of) --, whole without FSDP; and the
  // group its collectives run over.
  const auto cut_of = [&](const ParamSpec& p) {
    return fsdp ? parallelize.fsdp_cut_of(p, Shard{0, n}) : Shard{};
  };
  // Under FSDP x EP the experts' collectives run over the ranks holding them (the mesh's
  // "expert_shard", which under EP x TP spans TP indices), whatever their number.
  const auto kind_of = [&](const ParamSpec& p) {
    return fsdp && in.mesh.ep > 1 && is_expert(parallelize, p) ? kExpertShards : kRestShards;
  };
  // A stacked expert weight LoRA adapts (models/lora.h: gate_proj and up_proj together, or
  // down_proj, of a MoE model's sparse layers).
  const auto adapted_expert = [&](const std::string& name) {
    if (!frozen || !a.is_moe()) return false;
    return ((name.ends_with(".experts.gate_proj") || name.ends_with(".experts.up_proj")) &&
            in.lora.targets("gate_proj") && in.lora.targets("up_proj")) ||
           (name.ends_with(".experts.down_proj") && in.lora.targets("down_proj"));
  };
  for (const ParamGroupSpec& g : group_specs) {
    const int64_t group = param_group_numel(g.params);
    whole_numel.push_back(group);
    std::vector<ParamSpec> specs;
    for (const ParamSpec& p : g.params) specs.push_back(cut_of(p).spec_of(p));
    const int64_t shard = param_group_numel(specs);
    shard_numel.push_back(shard);
    // Ring bytes from the shard's elements (without the views' alignment), over each one's group.
    int64_t scattered = 0;
    for (const ParamSpec& p : specs) {
      scattered += ring_bytes(cut_of(p).count, shape_numel(p.shape) * kFloat);
    }
    scatter_bytes.push_back(scattered);
    std::vector<ParamSpec> base_masters;
    int64_t base_bf16 = 0;
    for (const ParamSpec& p : specs) {
      if (held_in_bf16(p.name)) {
        base_bf16 += shape_numel(p.shape);
      } else {
        base_masters.push_back(p);
      }
    }
    base_master_numel.push_back(param_group_numel(base_masters));
    base_bf16_numel.push_back(base_bf16);
    PerShardKind whole_rows{};
    for (const ParamSpec& p : g.params) whole_rows[kind_of(p)] += shape_numel(p.shape) * kFloat;
    scatter_whole_bytes.push_back(whole_rows);
    for (size_t kind = 0; kind < 2; ++kind) {
      // What such a use reads in bf16 (gathered into copies): the weights read only in bf16 --
      // but for a use of the parameters the experts LoRA adapts (their merge reads the masters:
      // gathered in fp32, their copies unread but in the unit's copy buffer) -- and through
      // copies a tied embedding too (the lm_head's copy). (A block has no use through copies;
      // its layout for one still sizes FSDP's send buffer.)
      const auto in_bf16 = [&](const std::string& name) {
        return bf16 &&
               ((DecoderLM::read_only_in_bf16(name) && (kind == 1 || !adapted_expert(name))) ||
                (kind == 1 && a.tie_word_embeddings && name == "model.embed_tokens.weight"));
      };
      // The masters a unit in flight holds: not those gathered into copies.
      std::vector<ParamSpec> masters;
      int64_t copied = 0, sent = 0, rounded = 0;
      PerShardKind whole_sent{};
      for (size_t i = 0; i < g.params.size(); ++i) {
        const ParamSpec& p = g.params[i];
        const int64_t own = shape_numel(specs[i].shape), ranks = cut_of(p).count;
        int64_t width = kFloat;
        if (in_bf16(p.name)) {
          copied += shape_numel(p.shape);
          if (!held_in_bf16(p.name)) rounded += own;  // a shard held in bf16 is sent as it is
          width = static_cast<int64_t>(dtype_size(DType::bf16));
        } else {
          masters.push_back(p);
          if (bf16 && adapted_expert(p.name)) copied += shape_numel(p.shape);
        }
        sent += ring_bytes(ranks, own * width);
        whole_sent[kind_of(p)] += shape_numel(p.shape) * width;
      }
      master_numel[kind].push_back(param_group_numel(masters));
      copy_numel[kind].push_back(copied);
      gather_bytes[kind].push_back(sent);
      gather_whole_bytes[kind].push_back(whole_sent);
      largest_send = std::max(largest_send, rounded);
    }
    resident += shard;
    largest_whole = std::max(largest_whole, group);
    largest_shard = std::max(largest_shard, shard);
  }

  MemoryPlan& m = plan.memory;
  m.parameters = m.gradients = resident * kFloat;
  m.optimizer = 2 * resident * kFloat;
  const std::vector<int64_t>& copies = copy_numel[1];  // every copy the model keeps
  const auto bf16_size = static_cast<int64_t>(dtype_size(DType::bf16));
  if (in.lora_base_bf16) {
    // fp32 masters only for what is read in fp32 (norms, the embedding's lookup, biases); the
    // rest held in bf16: in one process every group's copies at once as the weights (no block in
    // flight; a tied embedding's lm_head copy too), under FSDP the shards' bf16 rows
    // (FullyShardedGroups' bf16_shards), the units in flight as under bf16 with masters.
    TITAN_CHECK(bf16 && frozen, "plan: a bf16-only LoRA base under bf16 compute");
    int64_t masters = 0, held = 0;
    for (size_t g = 0; g < copies.size(); ++g) {
      masters += base_master_numel[g];
      held += fsdp ? base_bf16_numel[g] : copies[g];
    }
    m.parameters = masters * kFloat;
    m.compute_copies = held * bf16_size;
    // A merged export first widens the base into whole fp32 groups (widen_lora_base_to_fp32):
    // the masters it lacked. (Under FSDP its shards: below.)
    if (in.export_model_weights && !fsdp) {
      for (size_t g = 0; g < copies.size(); ++g) {
        m.export_gather += (whole_numel[g] - base_master_numel[g]) * kFloat;
      }
    }
  } else if (!fsdp) {
    const auto head = static_cast<size_t>(head_group_index(a));
    int64_t largest_block = 0;
    for (size_t g = 0; g < copies.size(); ++g) {
      if (g != head) largest_block = std::max(largest_block, copies[g]);
    }
    m.compute_copies = copies[head] * bf16_size;
    m.block_copies = largest_block * bf16_size;
  }
  CommPlan& c = plan.comm;
  c.micro_batches = in.accumulation_steps;
  if (fsdp) {
    // A micro-batch's uses in the model's order (ParamGroupHooks, models/causal_lm.h), walked with
    // the units whole at each: parameters in flight (masters -- under bf16 only those read in
    // fp32 -- and under bf16 the copies the gather fills or the model rounds, from the prefetch
    // that queues the gather on; a unit kept after its forward stays whole with its copies until
    // its backward) and whole gradients (the use's, and the last unit's until its reduce-scatter
    // is summed in at the next release with gradients); the bytes each gather and reduce-scatter
    // moves.
    const auto groups = static_cast<int64_t>(whole_numel.size());
    const int64_t blocks = a.num_hidden_layers, head = head_group_index(a);
    const ReshardPolicy policy = parse_reshard_policy(in.reshard_after_forward);
    // The bytes a unit whole for a use reading `reads` holds (never `nothing`): the masters it
    // reads and the copies it reads (DecoderLM::acquire).
    const auto in_use = [&](int64_t g, GroupReads reads) {
      const size_t kind = reads == GroupReads::through_copies ? 1 : 0;
      return master_numel[kind][g] * kFloat + copy_numel[kind][g] * bf16_size;
    };
    std::vector<int64_t> whole_now(static_cast<size_t>(groups), 0);  // in_use while whole, else 0
    std::vector<int64_t> grads_now(static_cast<size_t>(groups), 0);  // whole gradients
    std::vector<bool> prefetched(static_cast<size_t>(groups), false);
    int64_t whole_params = 0, whole_grads = 0;  // of the units whole now
    int64_t scattering = -1;                    // the unit whose reduce-scatter is in flight
    const auto moment = [&](int64_t params, int64_t grads) {
      m.unit_parameters = std::max(m.unit_parameters, params);
      m.unit_gradients = std::max(m.unit_gradients, grads);
      m.units_in_flight = std::max(m.units_in_flight, params + grads);
    };
    // Start-up initialises a whole unit at a time in fp32 (FullyShardedGroups::initialize): under
    // bf16 more than a unit in flight holds. (A base held in bf16 is loaded into the shards.)
    if (!in.lora_base_bf16) moment(largest_whole * kFloat, 0);
    // The gathers of the forward and the backward: the bytes a ring sends from this rank's rows
    // (rank 0's), and per group of ranks (ShardKind) their whole side and calls -- one call per
    // kind of view a unit has; the reduce-scatters likewise.
    struct Tally {
      int64_t sent = 0;
      PerShardKind whole{}, calls{};
      void add(int64_t ring, const PerShardKind& whole_side) {
        sent += ring;
        for (size_t k = 0; k < 2; ++k) {
          whole[k] += whole_side[k];
          calls[k] += whole_side[k] > 0 ? 1 : 0;
        }
      }
    };
    Tally gathered_forward, gathered_backward, scattered;
    const auto gather = [&](int64_t g, GroupReads reads, Tally& gathered) {
      const size_t kind = reads == GroupReads::through_copies ? 1 : 0;
      gathered.add(gather_bytes[kind][g], gather_whole_bytes[kind][g]);
      whole_now[g] = in_use(g, reads);
      whole_params += whole_now[g];
    };
    const auto finish_scatter = [&] {
      if (scattering == -1) return;
      whole_grads -= grads_now[scattering];
      grads_now[scattering] = 0;
      scattering = -1;
    };
    const auto prefetch = [&](int64_t g, GroupReads reads, Tally& gathered) {
      if (reads == GroupReads::nothing || whole_now[g] != 0) return;  // kept: no gather
      gather(g, reads, gathered);
      prefetched[g] = true;
      moment(whole_params, whole_grads);
    };
    const auto acquire = [&](int64_t g, bool gradients, GroupReads reads, Tally& gathered) {
      if (gradients && !frozen) {
        if (scattering == g) finish_scatter();
        whole_grads += whole_numel[g] * kFloat - grads_now[g];
        grads_now[g] = whole_numel[g] * kFloat;
      }
      if (reads == GroupReads::nothing || prefetched[g]) {
        prefetched[g] = false;
      } else if (whole_now[g] == 0) {
        gather(g, reads, gathered);
      } else if (reads == GroupReads::through_copies) {
        // Kept since a use that read its parameters: the copies only this use reads are made
        // now (a tied embedding's, from its kept master).
        const int64_t more = (copy_numel[1][g] - copy_numel[0][g]) * bf16_size;
        whole_now[g] += more;
        whole_params += more;
      }
      moment(whole_params, whole_grads);
    };
    const auto release = [&](int64_t g, GroupUseEnd end) {  // FullyShardedGroups::release
      if (end == GroupUseEnd::gradients && !frozen) {
        finish_scatter();
        scattered.add(scatter_bytes[g], scatter_whole_bytes[g]);
        scattering = g;
      } else if (keeps_whole(policy, end)) {
        return;
      }
      whole_params -= whole_now[g];
      whole_now[g] = 0;
    };
    // DecoderLM::forward and backward, with gradients.
    acquire(0, false, GroupReads::parameters, gathered_forward);
    if (blocks > 0) {
      prefetch(layer_group_index(0), GroupReads::parameters, gathered_forward);
    } else {
      prefetch(head, GroupReads::through_copies, gathered_forward);
    }
    release(0, GroupUseEnd::used_later);
    for (int64_t layer = 0; layer < blocks; ++layer) {
      const int64_t g = layer_group_index(layer);
      acquire(g, false, GroupReads::parameters, gathered_forward);
      if (layer + 1 == blocks) {
        prefetch(head, GroupReads::through_copies, gathered_forward);
      } else {
        prefetch(layer_group_index(layer + 1), GroupReads::parameters, gathered_forward);
      }
      release(g, layer + 1 == blocks ? GroupUseEnd::used_next : GroupUseEnd::used_later);
    }
    // The final norm and loss into their backward, the lm_head through its copy.
    acquire(head, true, GroupReads::through_copies, gathered_forward);
    if (blocks > 0)
      prefetch(layer_group_index(blocks - 1), GroupReads::parameters, gathered_backward);
    release(head, GroupUseEnd::gradients);
    for (int64_t layer = blocks; layer-- > 0;) {
      const int64_t g = layer_group_index(layer);
      acquire(g, true, GroupReads::parameters, gathered_backward);
      if (layer > 0)
        prefetch(layer_group_index(layer - 1), GroupReads::parameters, gathered_backward);
      release(g, GroupUseEnd::gradients);
    }
    acquire(0, true, GroupReads::nothing, gathered_backward);
    release(0, GroupUseEnd::gradients);
    c.all_gather_forward = gathered_forward.sent;
    c.all_gather_backward = gathered_backward.sent;
    c.reduce_scatter = scattered.sent;
    const int64_t mb = in.accumulation_steps;
    c.rows.push_back({"dp_shard", Collective::all_gather, mb * gathered_forward.calls[kRestShards],
                      mb * gathered_forward.whole[kRestShards],
                      "FSDP: the forward's units, every micro-batch"});
    c.rows.push_back({"dp_shard", Collective::all_gather, mb * gathered_backward.calls[kRestShards],
                      mb * gathered_backward.whole[kRestShards],
                      "FSDP: the backward's units not kept since the forward"});
    if (scattered.calls[kRestShards] > 0) {
      c.rows.push_back({"dp_shard", Collective::reduce_scatter, mb * scattered.calls[kRestShards],
                        mb * scattered.whole[kRestShards], "FSDP: each unit's gradients"});
    }
    // FSDP x EP: a sparse block's experts, sharded over the ranks holding them, move in a
    // collective of their own after the shard group's (FullyShardedGroups::queue).
    const struct {
      const Tally& tally;
      Collective collective;
      const char* what;
    } expert_rows[] = {
        {gathered_forward, Collective::all_gather,
         "FSDP x EP: the forward's units' experts (over the ranks holding them), every "
         "micro-batch"},
        {gathered_backward, Collective::all_gather,
         "FSDP x EP: the backward's units' experts not kept since the forward"},
        {scattered, Collective::reduce_scatter,
         "FSDP x EP: each sparse unit's experts' gradients (every EP rank's tokens already in "
         "them)"},
    };
    for (const auto& r : expert_rows) {
      if (r.tally.calls[kExpertShards] == 0) continue;
      c.rows.push_back({"expert_shard", r.collective, mb * r.tally.calls[kExpertShards],
                        mb * r.tally.whole[kExpertShards], r.what});
    }

    // One reduced shard (none for a frozen model), and under bf16 the send buffer this rank's rows
    // are rounded into.
    m.collective_buffers = (frozen ? 0 : largest_shard * kFloat) + largest_send * bf16_size;
    // A base held in bf16 first widens its shards into whole fp32 shard groups before a merged
    // export (FullyShardedGroups::widen_bf16_shards): the masters they lacked, kept to the end.
    for (size_t g = 0; in.export_model_weights && in.lora_base_bf16 && g < shard_numel.size();
         ++g) {
      m.export_gather += (shard_numel[g] - base_master_numel[g]) * kFloat;
    }
  }
  // The export brings one run of a unit's parameters at a time whole onto rank 0
  // (Parallelism::gather_for_export; a LoRA adapter alone gathers none), each parameter charged
  // its span (ParamGroup::acquire_params_where): under FSDP the run of the model's group gathered
  // from the shards (the previous one handed back first); under TP or EP the run of a whole group
  // gathered from the TP or EP ranks' parts, each row-wise parameter's parts first in rank order
  // beside it -- under FSDP x EP both, the whole run handed back only once the next run's part
  // has come from the shards.
  const bool cuts = in.mesh.tp > 1 || in.mesh.ep > 1;
  const std::vector<ParamGroupSpec> whole_specs = model_param_specs(a);
  if (in.export_model_weights && (fsdp || cuts)) {
    HfExportOptions export_options;
    export_options.dtype = in.export_dtype;
    const auto span_of = [](const ParamGroupSpec& g, const ExportRun& run) {
      int64_t span = 0;
      for (const ParamSpec& p : g.params) {
        if (std::find(run.params.begin(), run.params.end(), p.name) != run.params.end())
          span += param_view_span(shape_numel(p.shape));
      }
      return span;
    };
    int64_t previous_whole = 0, most = 0;  // floats
    for (const ExportRun& run : hf_export_runs(a, export_options)) {
      const int64_t part = fsdp ? span_of(group_specs[run.group], run) : 0;
      int64_t whole = 0, largest_cut = 0;
      if (cuts) {
        whole = span_of(whole_specs[run.group], run);
        for (const ParamSpec& p : whole_specs[run.group].params) {
          if (std::find(run.params.begin(), run.params.end(), p.name) == run.params.end()) continue;
          const Shard cut = parallelize.placement_of(p);
          if (cut.count > 1 && cut.dim != 0) {
            largest_cut = std::max(largest_cut, shape_numel(p.shape));
          }
        }
      }
      most = std::max(most, part + std::max(previous_whole, whole + largest_cut));
      previous_whole = whole;
    }
    m.export_gather += most * kFloat;
  }
  if (cuts && in.checkpoint_saves) {
    // A synchronous save gathers one tensor at a time onto rank 0 as the writer reaches it
    // (Parallelism::checkpoint_source; a parameter's and its AdamW moments' alike): its whole,
    // and a row-wise parameter's cuts beside it before they are placed -- under FSDP (x TP, x EP
    // or both) also rank 0's part of it, gathered first from the shards' rows
    // (Parallelism::gather_checkpoint_tensor).
    for (size_t g = 0; g < whole_specs.size(); ++g) {
      for (size_t i = 0; i < whole_specs[g].params.size(); ++i) {
        const ParamSpec& p = whole_specs[g].params[i];
        const Shard cut = parallelize.placement_of(p);
        const int64_t part = shape_numel(group_specs[g].params[i].shape);
        const int64_t row_cuts = cut.count > 1 && cut.dim != 0 ? cut.count * part : 0;
        m.checkpoint_gather = std::max(
            m.checkpoint_gather, (shape_numel(p.shape) + row_cuts + (fsdp ? part : 0)) * kFloat);
      }
    }
  }
  const auto activations = [&](const ActivationCheckpointing& checkpointing) {
    return DecoderLM::activation_bytes_of(a, in.compute_dtype, checkpointing, in.local_batch_size,
                                          in.seq_len,
                                          {.tp_degree = in.mesh.tp,
                                           .sequence_parallel = in.sequence_parallel,
                                           .ep_degree = in.mesh.ep,
                                           .lora = in.lora.rank > 0,
                                           .lm_head_loss = in.lm_head_loss});
  };
  m.activations_none = activations(ActivationCheckpointing::none());
  m.activations_full = activations(ActivationCheckpointing::full());
  m.activations = activations(in.checkpointing);
  if (in.mesh.ep > 1) {
    m.expert_parallel_rooms = DecoderLM::expert_parallel_bytes_of(
        a, in.compute_dtype, in.checkpointing, in.local_batch_size, in.seq_len,
        {.tp_degree = in.mesh.tp,
         .sequence_parallel = in.sequence_parallel,
         .ep_degree = in.mesh.ep,
         .lora = in.lora.rank > 0,
         .lm_head_loss = in.lm_head_loss});
    // Each rank routes its tokens: under EP x TP its seq_len / tp tokens of each sequence.
    m.expert_parallel_rows = most_arrived_rows(in.local_batch_size * in.seq_len / in.mesh.tp,
                                               a.num_experts_per_tok, a.num_experts, in.mesh.ep);
  }
  m.rope = 2 * in.seq_len * (a.head_dim / 2) * kFloat;  // cos and sin (ops/rope.h)
  m.writer_staging = 2 * static_cast<int64_t>(kSafetensorsStagingBytes);

  // All-reduce, one per group: a reduce-scatter and an all-gather of the buffer over the
  // replicas.
  const int64_t replicas = in.mesh.dp_replicate;
  if (in.mesh.ep > 1 && !fsdp) {
    // Without FSDP: the experts' gradients over the ranks holding the same experts (the
    // replicas), the others' over every data-parallel rank; a run of each at a time.
    for (const ParamGroupSpec& g : group_specs) {
      for (const ParamSpec& p : g.params) {
        const bool expert = is_expert(parallelize, p);
        const int64_t ranks = expert ? replicas : in.mesh.dp();
        c.all_reduce += 2 * (ranks - 1) * shape_numel(p.shape) * kFloat / ranks;
      }
    }
  } else {
    // HSDP (under EP too: a replica's shard ranks hold the same rows of the experts and the rest).
    for (const int64_t shard : shard_numel)
      c.all_reduce += 2 * (replicas - 1) * shard * kFloat / replicas;
  }
  if (in.lora.rank > 0) {
    int64_t adapter = 0;
    // The adapter is whole on every rank (FSDP shards only the frozen model): one all-reduce per
    // group over all of them.
    const int64_t ranks = in.mesh.dp();
    c.all_reduce = 0;
    int64_t widest_input = 0;   // of an adapted linear (A's columns), the experts' aside
    int64_t widest_output = 0;  // of an adapted linear (B's rows), the experts' aside
    for (const ParamGroupSpec& g : lora_param_specs(a, in.lora)) {
      const int64_t group = param_group_numel(g.params);
      adapter += group;
      c.all_reduce += 2 * (ranks - 1) * group * kFloat / ranks;
      for (const ParamSpec& p : g.params) {
        if (p.name.find(".mlp.experts") != std::string::npos) continue;
        if (p.name.ends_with(".lora_A.weight")) widest_input = std::max(widest_input, p.shape[1]);
        if (p.name.ends_with(".lora_B.weight")) widest_output = std::max(widest_output, p.shape[0]);
      }
    }
    const int64_t full = m.gradients + m.optimizer;
    m.lora_parameters = adapter * kFloat;
    m.parameters += m.lora_parameters;
    m.gradients = adapter * kFloat;
    m.optimizer = 2 * adapter * kFloat;
    m.lora_saved = full - m.gradients - m.optimizer;
    int64_t sparse_layers = 0;
    for (int64_t i = 0; a.is_moe() && i < a.num_hidden_layers; ++i) {
      sparse_layers += a.layer_is_sparse(i) ? 1 : 0;
    }
    const int64_t adapted = (in.lora.targets("gate_proj") ? 2 : 0) +
                            (in.lora.targets("down_proj") ? 1 : 0),
                  experts = a.num_experts * a.hidden_size * a.moe_intermediate_size;
    if (sparse_layers > 0 && adapted > 0) {
      m.lora_scratch = adapted * experts * (2 * kFloat + (bf16 ? 2 : 0));
    }
    // Dropout's rooms (nn/lora.h LoraScratch): the widest adapted input of a micro-batch masked,
    // the dx share, and the masked input rounded, which fp32 compute makes too.
    if (in.lora.dropout > 0.0) {
      m.lora_scratch += in.local_batch_size * in.seq_len * widest_input * (2 * kFloat + 2);
    }
    // The rank-wide rooms (nn/lora.h LoraScratch::rank_rooms) of the adapted linears, for the
    // micro-batch's tokens: fp32 and bf16 products, B^T, and A, B and B^T rounded.
    if (widest_input > 0) {
      const int64_t tokens = in.local_batch_size * in.seq_len;
      m.lora_scratch += in.lora.rank * (12 * tokens + 8 * widest_output + 2 * widest_input);
    }
  }

  append_gradient_rows(in, group_specs, parallelize, shard_numel, c.rows);
  if (in.mesh.tp > 1) append_tensor_parallel_rows(in, c.rows);
  if (in.mesh.ep > 1) {
    const double routed =
        uniform_routed_rows(a, in.mesh.ep, in.local_batch_size * in.seq_len / in.mesh.tp);
    c.rows.push_back(expert_parallel_row(a, in.mesh.ep, in.accumulation_steps, in.compute_dtype,
                                         in.checkpointing, routed, routed));
  }
  const int64_t rank_tokens = in.accumulation_steps * in.local_batch_size * in.seq_len;
  plan.tokens_per_step = rank_tokens * in.mesh.dp();
  plan.flops_per_token = training_flops_per_token(a, in.seq_len, parallelize);
  plan.flops_per_step_rank = plan.flops_per_token * static_cast<double>(rank_tokens);
  return plan;
}

CommRow expert_parallel_row(const ModelArgs& args, int64_t ep, int64_t micro_batches,
                            DType compute_dtype, const ActivationCheckpointing& checkpointing,
                            double rows_out, double rows_in) {
  int64_t sparse = 0, recomputed = 0;
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) {
    if (!args.layer_is_sparse(i)) continue;
    ++sparse;
    recomputed += checkpointing.recomputes_layer(i) ? 1 : 0;
  }
  const auto h = static_cast<double>(args.hidden_size);
  const double x_bytes = compute_dtype == DType::bf16 ? 2.0 : 4.0;
  // The counts: this rank's rows for each of the other ranks' E / ep experts, as int32.
  const auto counts = static_cast<double>((ep - 1) * (args.num_experts / ep) * 4);
  const double forward = counts + rows_out * h * x_bytes + rows_in * h * 4.0;
  const double backward = rows_out * (h * 4.0 + 4.0 + h * x_bytes) + rows_in * (h * 4.0 + 4.0);
  const double bytes =
      static_cast<double>(micro_batches) *
      (static_cast<double>(sparse + recomputed) * forward + static_cast<double>(sparse) * backward);
  return {"ep", Collective::all_to_all_v, micro_batches * (3 * (sparse + recomputed) + 5 * sparse),
          static_cast<int64_t>(std::llround(bytes)),
          "expert parallel: each sparse layer's row counts, routed rows to their experts and back "
          "(forward 3, backward 5 calls); bytes an expectation under uniform routing"};
}

double uniform_routed_rows(const ModelArgs& args, int64_t ep, int64_t tokens) {
  return static_cast<double>(tokens * args.num_experts_per_tok) * static_cast<double>(ep - 1) /
         static_cast<double>(ep);
}

}  // namespace titan
