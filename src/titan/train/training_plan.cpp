#include "titan/train/training_plan.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <vector>

#include "titan/core/error.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/flops.h"
#include "titan/models/hf_export.h"
#include "titan/models/parallelize.h"
#include "titan/models/param_count.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"
#include "titan/train/job_resolve.h"
#include "titan/train/lora_job.h"
#include "titan/train/parallelism.h"

namespace titan {
namespace {

constexpr int64_t kFloat = sizeof(float);

// FSDP's shard of a group (distributed/fsdp.h): every parameter's dim 0 cut to ceil(d0 / N) rows.
std::vector<ParamSpec> shard_specs(const std::vector<ParamSpec>& whole, int64_t shards) {
  std::vector<ParamSpec> specs;
  for (const ParamSpec& s : whole) specs.push_back(Shard{0, shards}.spec_of(s));
  return specs;
}

// Bytes each rank sends in a ring all-gather or reduce-scatter whose whole side is
// `ranks` x `shard_bytes`.
int64_t ring_bytes(int64_t ranks, int64_t shard_bytes) {
  return (ranks - 1) * shard_bytes;
}

}  // namespace

PlanInputs plan_inputs(const JobConfig& config, int64_t world_size) {
  PlanInputs in;
  in.mesh = resolve_mesh_dims(job_parallel_degrees(config), world_size);
  in.accumulation_steps = job_accumulation_steps(config, in.mesh);
  in.sequence_parallel = in.mesh.tp > 1 && config.parallelism.enable_sequence_parallel;
  in.args = resolve_job_model_args(config);
  check_job_sizes(config, in.args, in.mesh);
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
    check_lora_config(config);
    in.lora = job_lora_options(config);
    check_lora_base_dtype(config, in.args, in.mesh.dp_shard);
    in.lora_base_bf16 = lora_base_in_bf16(config);
  }
  // The kernels [overrides] names, a plugin's too, and their constraints on the step's shapes, as
  // titan train refuses them before allocating.
  in.override_warnings = decoder_lm_overrides(in.args, resolve_job_kernels(config).overrides,
                                              in.compute_dtype, in.local_batch_size, in.seq_len)
                             .warnings;
  return in;
}

std::array<int64_t, kMemCategoryCount> MemoryPlan::step_by_category() const {
  std::array<int64_t, kMemCategoryCount> c{};
  c[static_cast<int>(MemCategory::parameters)] =
      parameters + compute_copies + block_copies + unit_parameters + checkpoint_whole_parameters;
  c[static_cast<int>(MemCategory::gradients)] = gradients + unit_gradients;
  c[static_cast<int>(MemCategory::optimizer)] = optimizer + checkpoint_whole_optimizer;
  c[static_cast<int>(MemCategory::activations)] = activations;
  c[static_cast<int>(MemCategory::other)] = rope + collective_buffers + lora_scratch;
  return c;
}

int64_t MemoryPlan::step_peak() const {
  int64_t total = units_in_flight;
  for (const int64_t bytes : step_by_category()) total += bytes;
  return total - unit_parameters - unit_gradients;
}

int64_t MemoryPlan::checkpoint_peak() const {
  return step_peak() - units_in_flight + writer_staging;
}

int64_t MemoryPlan::export_peak() const {
  return checkpoint_peak() + export_gather;
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
  const bool fsdp = n > 1;
  // LoRA freezes the model: its units have no gradients, in flight or sharded.
  const bool frozen = in.lora.rank > 0;

  // Floats per rank of each group's buffers (FSDP: its shard) and of the largest whole group;
  // per group, for a use reading parameters [0] and one reading through_copies [1] (GroupReads),
  // its fp32 masters and the elements of its bf16 copies (DecoderLM::allocate_compute_weights: the
  // weights read only in bf16, and a tied embedding's lm_head copy, which [1] reads) and under FSDP
  // the bytes of this rank's rows its all-gather sends (FullyShardedGroups::start_gather; rank 0
  // holds the most rows), and the most bf16 rows one gather rounds into the send buffer.
  const bool bf16 = in.compute_dtype == DType::bf16;
  int64_t resident = 0, largest_whole = 0, largest_shard = 0, largest_send = 0;
  std::vector<int64_t> shard_numel, whole_numel, shard_rows_numel;
  std::array<std::vector<int64_t>, 2> gather_bytes, master_numel, copy_numel;
  // Rank 0's parts of the parameters, as its model is built (Parallelism::plan; the TP ranks'
  // parts are the same sizes).
  ParallelAxes axes;
  axes.tp_degree = in.mesh.tp;
  axes.sequence_parallel = in.sequence_parallel;
  const ParallelizePlan parallelize = Parallelism::plan(a, axes);
  const std::vector<ParamGroupSpec> group_specs = local_param_specs(a, parallelize);
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
    const std::vector<ParamSpec> specs = fsdp ? shard_specs(g.params, n) : g.params;
    const int64_t shard = param_group_numel(specs);
    shard_numel.push_back(shard);
    int64_t rows = 0;  // the shard's elements without the views' alignment
    for (const ParamSpec& p : specs) rows += shape_numel(p.shape);
    shard_rows_numel.push_back(rows);
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
      for (size_t i = 0; i < g.params.size(); ++i) {
        const ParamSpec& p = g.params[i];
        const int64_t own = shape_numel(specs[i].shape);
        if (in_bf16(p.name)) {
          copied += shape_numel(p.shape);
          rounded += own;
          sent += own * static_cast<int64_t>(dtype_size(DType::bf16));
        } else {
          masters.push_back(p);
          sent += own * kFloat;
          if (bf16 && adapted_expert(p.name)) copied += shape_numel(p.shape);
        }
      }
      master_numel[kind].push_back(param_group_numel(masters));
      copy_numel[kind].push_back(copied);
      gather_bytes[kind].push_back(sent);
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
    // Every group's copies held at once as the weights; masters only for what is read in fp32
    // (norms, the embedding's lookup, biases).
    TITAN_CHECK(!fsdp && bf16 && frozen,
                "plan: a bf16-only LoRA base in one process or "
                "replicas, under bf16 compute");
    int64_t masters = 0, held = 0;
    for (size_t g = 0; g < copies.size(); ++g) {
      masters += master_numel[0][g];
      held += copies[g];
    }
    m.parameters = masters * kFloat;
    m.compute_copies = held * bf16_size;
    // A merged export first widens the base into whole fp32 groups (widen_lora_base_to_fp32):
    // the masters it lacked.
    if (in.export_model_weights) {
      for (size_t g = 0; g < copies.size(); ++g) {
        m.export_gather += (whole_numel[g] - master_numel[0][g]) * kFloat;
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
    // bf16 more than a unit in flight holds.
    moment(largest_whole * kFloat, 0);
    int64_t gathered_forward = 0, gathered_backward = 0, scattered = 0;  // bytes per rank
    const auto gather = [&](int64_t g, GroupReads reads, int64_t& gathered) {
      gathered += gather_bytes[reads == GroupReads::through_copies ? 1 : 0][g];
      whole_now[g] = in_use(g, reads);
      whole_params += whole_now[g];
    };
    const auto finish_scatter = [&] {
      if (scattering == -1) return;
      whole_grads -= grads_now[scattering];
      grads_now[scattering] = 0;
      scattering = -1;
    };
    const auto prefetch = [&](int64_t g, GroupReads reads, int64_t& gathered) {
      if (reads == GroupReads::nothing || whole_now[g] != 0) return;  // kept: no gather
      gather(g, reads, gathered);
      prefetched[g] = true;
      moment(whole_params, whole_grads);
    };
    const auto acquire = [&](int64_t g, bool gradients, GroupReads reads, int64_t& gathered) {
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
        scattered += shard_rows_numel[g] * kFloat;
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
    c.all_gather_forward = ring_bytes(n, gathered_forward);
    c.all_gather_backward = ring_bytes(n, gathered_backward);
    c.reduce_scatter = ring_bytes(n, scattered);

    // One reduced shard (none for a frozen model), and under bf16 the send buffer this rank's rows
    // are rounded into.
    m.collective_buffers = (frozen ? 0 : largest_shard * kFloat) + largest_send * bf16_size;
    // The export gathers one run of a unit's parameters at a time onto rank 0, each parameter
    // charged its span (ParamGroup::acquire_params_where); a LoRA adapter alone gathers none.
    if (in.export_model_weights) {
      HfExportOptions export_options;
      export_options.dtype = in.export_dtype;
      for (const ExportRun& run : hf_export_runs(a, export_options)) {
        int64_t run_numel = 0;
        for (const ParamSpec& p : group_specs[run.group].params) {
          if (std::find(run.params.begin(), run.params.end(), p.name) != run.params.end()) {
            run_numel += param_view_span(shape_numel(p.shape));
          }
        }
        m.export_gather = std::max(m.export_gather, run_numel * kFloat);
      }
    }
  }
  if (in.mesh.tp > 1 && !fsdp) {
    // Rank 0 gathers whole groups (train/parallelism.h): the export a run at a time, each
    // row-wise parameter's cuts first in rank order beside it; each checkpoint the whole state.
    const std::vector<ParamGroupSpec> whole_specs = model_param_specs(a);
    if (in.export_model_weights) {
      HfExportOptions export_options;
      export_options.dtype = in.export_dtype;
      for (const ExportRun& run : hf_export_runs(a, export_options)) {
        int64_t run_numel = 0, largest_cut = 0;
        for (const ParamSpec& p : whole_specs[run.group].params) {
          if (std::find(run.params.begin(), run.params.end(), p.name) == run.params.end()) continue;
          run_numel += param_view_span(shape_numel(p.shape));
          const Shard cut = parallelize.placement_of(p);
          if (cut.count > 1 && cut.dim != 0) {
            largest_cut = std::max(largest_cut, shape_numel(p.shape));
          }
        }
        m.export_gather = std::max(m.export_gather, (run_numel + largest_cut) * kFloat);
      }
    }
    if (in.checkpoint_saves) {
      int64_t whole = 0;
      for (const ParamGroupSpec& g : whole_specs) whole += param_group_numel(g.params);
      m.checkpoint_whole_parameters = whole * kFloat;
      m.checkpoint_whole_optimizer = 2 * whole * kFloat;
    }
  }
  const auto activations = [&](const ActivationCheckpointing& checkpointing) {
    return DecoderLM::activation_bytes_of(a, in.compute_dtype, checkpointing, in.local_batch_size,
                                          in.seq_len, in.mesh.tp, in.sequence_parallel,
                                          in.lora.rank > 0);
  };
  m.activations_none = activations(ActivationCheckpointing::none());
  m.activations_full = activations(ActivationCheckpointing::full());
  m.activations = activations(in.checkpointing);
  m.rope = 2 * in.seq_len * (a.head_dim / 2) * kFloat;  // cos and sin (ops/rope.h)
  m.writer_staging = 2 * static_cast<int64_t>(kSafetensorsStagingBytes);

  // All-reduce, one per group: a reduce-scatter and an all-gather of the buffer over the
  // replicas.
  const int64_t replicas = in.mesh.dp_replicate;
  for (const int64_t shard : shard_numel)
    c.all_reduce += 2 * (replicas - 1) * shard * kFloat / replicas;
  if (in.lora.rank > 0) {
    int64_t adapter = 0;
    // The adapter is whole on every rank (FSDP shards only the frozen model): one all-reduce per
    // group over all of them.
    const int64_t ranks = in.mesh.dp();
    c.all_reduce = 0;
    int64_t widest_input = 0;  // of an adapted linear (A's columns), the experts' aside
    for (const ParamGroupSpec& g : lora_param_specs(a, in.lora)) {
      const int64_t group = param_group_numel(g.params);
      adapter += group;
      c.all_reduce += 2 * (ranks - 1) * group * kFloat / ranks;
      for (const ParamSpec& p : g.params) {
        if (p.name.ends_with(".lora_A.weight") && p.name.find(".mlp.experts") == std::string::npos)
          widest_input = std::max(widest_input, p.shape[1]);
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
  }

  const int64_t rank_tokens = in.accumulation_steps * in.local_batch_size * in.seq_len;
  plan.tokens_per_step = rank_tokens * in.mesh.dp();
  plan.flops_per_token = training_flops_per_token(a, in.seq_len, parallelize);
  plan.flops_per_step_rank = plan.flops_per_token * static_cast<double>(rank_tokens);
  return plan;
}

}  // namespace titan
