#include "titan/train/job_config_torchtitan.h"

namespace titan {
namespace {

struct InertKeys {
  // Every key by name, so that a misspelt one stays an error.
  std::initializer_list<std::string_view> keys;
  const char* reason;
};

// torchtitan's JobConfig (torchtitan/config/job_config.py, February 2026) minus what titan
// implements (job_config.cpp's fields) and minus keys whose silent omission would change what is
// trained (those stay unknown, so an error).
const InertKeys kInert[] = {
    {{"profiling.profiler_warmup"},
     "titan's recorder has nothing to warm up: a recorded step is timed as it runs (torch's "
     "profiler discards its warm-up steps)"},
    {{"profiling.enable_memory_snapshot", "profiling.save_memory_snapshot_folder"},
     "titan writes no allocation-history snapshots (PyTorch's CUDA allocator format): its "
     "accounted allocator's current and peak bytes per category are in the metrics line, the "
     "JSONL and the summary"},
    {{"metrics.enable_wandb"},
     "titan has no Weights & Biases client (metrics.enable_tensorboard and metrics.save_jsonl "
     "record the same scalars)"},
    {{"metrics.save_for_all_ranks"},
     "rank 0 logs for the job: its loss and grad norm are the global batch's and its memory "
     "figures the maximum over the ranks"},
    {{"metrics.disable_color_printing"}, "titan's log has no colors"},
    {{"compile.enable", "compile.components", "compile.backend", "training.compile"},
     "titan's kernels are compiled ahead of time (there is no torch.compile)"},
    {{"quantize.linear.float8.enable_fsdp_float8_all_gather",
      "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
      "quantize.linear.float8.recipe_name", "quantize.linear.float8.filter_fqns",
      "quantize.linear.float8.emulate", "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice",
      "quantize.linear.mx.recipe_name", "quantize.linear.mx.filter_fqns",
      "quantize.grouped_mm.float8.fqns", "quantize.grouped_mm.mx.recipe_name",
      "quantize.grouped_mm.mx.fqns", "model.converters", "model.print_after_conversion"},
     "no float8 or MX training here: matmuls compute in fp32 or bf16 "
     "(training.mixed_precision_param)"},
    {{"checkpoint.enable_ft_dataloader_checkpoints", "checkpoint.exclude_from_loading",
      "checkpoint.enable_first_step_checkpoint", "checkpoint.create_seed_checkpoint",
      "checkpoint.load_only", "checkpoint.initial_load_in_hf_quantized"},
     "not implemented by titan's checkpoints (docs/TRAINING.md lists what they do)"},
    {{"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns"},
     "titan's selective \"op\" policy is fixed: it keeps every matmul's output and remakes the "
     "RMSNorms' (docs/TRAINING.md)"},
    {{"activation_checkpoint.preserve_rng_state", "activation_checkpoint.determinism_check"},
     "titan's forward draws no random numbers and its recomputation runs the same kernels on the "
     "same inputs, bit for bit"},
    {{"activation_checkpoint.early_stop", "activation_checkpoint.debug"},
     "they tune torch.utils.checkpoint, which titan does not use (its backward recomputes a "
     "layer itself)"},
    {{"activation_checkpoint.memory_budget",
      "activation_checkpoint.visualize_memory_budget_pareto"},
     "they serve mode \"memory_budget\", torch.compile's partitioner (titan's modes are none, "
     "full and selective)"},
    {{"parallelism.disable_loss_parallel", "parallelism.enable_async_tensor_parallel",
      "parallelism.module_fqns_per_model_part",
      "parallelism.pipeline_parallel_first_stage_less_layers",
      "parallelism.pipeline_parallel_last_stage_less_layers",
      "parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_schedule",
      "parallelism.pipeline_parallel_schedule_csv", "parallelism.pipeline_parallel_microbatch_size",
      "parallelism.pipeline_parallel_expert_parallel_overlap",
      "parallelism.context_parallel_load_balancer", "parallelism.context_parallel_rotate_method",
      "parallelism.expert_tensor_parallel_degree", "parallelism.expert_parallel_comm_backend"},
     "titan runs data parallelism only (tensor, pipeline, context and expert degrees are 1)"},
    {{"job.print_config", "job.save_config_file", "job.config_file"},
     "titan train --print-config prints the resolved config, and every run saves it as "
     "job.dump_folder/job_config.toml"},
    {{"job.custom_config_module", "experimental.custom_args_module"},
     "no Python runs here (experimental.custom_import loads a kernel plugin)"},
    {{"model.tokenizer_path"},
     "the tokenizer is model.hf_assets_path's tokenizer.json (the default run trains its own)"},
    {{"optimizer.implementation", "optimizer.early_step_in_backward"},
     "titan's AdamW is its own loop over each flat parameter buffer, after the backward"},
    {{"training.dataloader.num_workers", "training.dataloader.persistent_workers",
      "training.dataloader.pin_memory", "training.dataloader.prefetch_factor",
      "validation.dataloader.num_workers", "validation.dataloader.persistent_workers",
      "validation.dataloader.pin_memory", "validation.dataloader.prefetch_factor",
      "training.enable_cpu_offload", "training.gc_freq", "training.gc_debug"},
     "titan's loader is one background thread and it has no Python garbage collector or "
     "offload: everything is in host memory already"},
    {{"comm.trace_buf_size", "comm.save_traces_folder", "comm.save_traces_file_prefix",
      "comm.mode"},
     "flight-recorder traces are PyTorch's NCCL feature (titan's collectives are MPI's)"},
    {{"memory_estimation.enable", "memory_estimation.disable_fake_mode"},
     "titan plan estimates a job's memory from its config"},
    {{"fault_tolerance.enable", "fault_tolerance.process_group",
      "fault_tolerance.process_group_timeout_ms", "fault_tolerance.replica_id",
      "fault_tolerance.group_size", "fault_tolerance.min_replica_size",
      "fault_tolerance.semi_sync_method"},
     "no torchft here"},
    {{"debug.deterministic_warn_only", "debug.moe_force_load_balance"},
     "titan's kernels are deterministic for a given thread count, and MoE routing is the "
     "model's"},
};

}  // namespace

const char* torchtitan_inert_key_reason(std::string_view key) {
  for (const InertKeys& group : kInert) {
    for (std::string_view entry : group.keys) {
      if (key == entry) return group.reason;
    }
  }
  return nullptr;
}

std::vector<std::string> torchtitan_inert_keys_in(std::string_view section) {
  std::vector<std::string> keys;
  for (const InertKeys& group : kInert) {
    for (std::string_view entry : group.keys) {
      if (entry.size() > section.size() && entry.starts_with(section) &&
          entry[section.size()] == '.') {
        keys.emplace_back(entry.substr(section.size() + 1));
      }
    }
  }
  return keys;
}

}  // namespace titan
