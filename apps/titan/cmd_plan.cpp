// `titan plan [train's config flags] [--nproc N] [--threads T] [--json]`: what the training job
// would take per rank -- memory by category and its peak, FLOPs and communication per step -- from
// its config alone, before anything is read or allocated (train/training_plan.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/io/byte_size.h"
#include "titan/train/job_config.h"
#include "titan/train/job_resolve.h"
#include "titan/train/training_plan.h"

namespace titan::cli {
namespace {

std::string bytes(int64_t n) {
  return format_byte_size(static_cast<uint64_t>(n));
}

// "1 rank", "4 ranks"
std::string count(int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string mesh_name(const MeshDims& d) {
  if (d.world() == 1) return "one process";
  const std::string tp = "TP " + std::to_string(d.tp);
  const std::string ep = d.ep == 1 ? "" : " x EP " + std::to_string(d.ep);
  if (d.dp() == 1) {
    return tp + ep + " (tensor_parallel_degree " + std::to_string(d.tp) +
           (d.ep == 1 ? "" : ", expert_parallel_degree " + std::to_string(d.ep)) + ")";
  }
  const std::string dims = "dp_replicate " + std::to_string(d.dp_replicate) + " x dp_shard " +
                           std::to_string(d.dp_shard) +
                           (d.tp == 1 ? "" : " x tp " + std::to_string(d.tp)) +
                           (d.ep == 1 ? "" : ", ep " + std::to_string(d.ep) + " borrowed");
  const std::string data = !d.fsdp() ? "DDP" : d.dp_replicate == 1 ? "FSDP" : "HSDP";
  return data + (d.tp == 1 ? "" : " x " + tp) + ep + " (" + dims + ")";
}

// The [activation_checkpoint] keys that give `checkpointing`, as a config spells them.
std::string config_spelling(const ActivationCheckpointing& checkpointing) {
  using Mode = ActivationCheckpointing::Mode;
  if (checkpointing.mode == Mode::none || checkpointing.mode == Mode::full) {
    return "activation_checkpoint.mode = \"" + checkpointing.name() + "\"";
  }
  return "activation_checkpoint.mode = \"selective\", selective_ac_option = \"" +
         (checkpointing.mode == Mode::ops ? std::string("op")
                                          : std::to_string(checkpointing.every)) +
         "\"";
}

void row(const char* label, int64_t n, const std::string& detail) {
  std::printf("  %-22s %10s  %s\n", label, bytes(n).c_str(), detail.c_str());
}

// device: training.device; on a GPU the same categories live in its memory.
void print_text(const TrainingPlan& p, const std::string& model, const std::string& device) {
  const PlanInputs& in = p.inputs;
  const MemoryPlan& m = p.memory;
  const bool fsdp = in.mesh.fsdp();
  std::printf("model %s (%s, %lld parameters), %s: %s\n", model.c_str(),
              in.args.architecture.c_str(), static_cast<long long>(p.parameter_count),
              count(in.mesh.world(), "rank", "ranks").c_str(), mesh_name(in.mesh).c_str());
  std::printf("a step: %s of %lld x %lld tokens per rank, %lld tokens in all; matmuls in %s\n",
              count(in.accumulation_steps, "micro-batch", "micro-batches").c_str(),
              static_cast<long long>(in.local_batch_size), static_cast<long long>(in.seq_len),
              static_cast<long long>(p.tokens_per_step),
              in.lora_base_bf16                 ? "bf16 (the frozen base in bf16 only)"
              : in.compute_dtype == DType::bf16 ? "bf16 (fp32 masters)"
                                                : "fp32");
  if (device == "cpu") {
    std::printf("\nmemory per rank (the trainer's categories)\n");
  } else {
    // The same plan: the trainer carves the same Buffers from the device's memory.
    std::printf(
        "\nmemory per rank (the trainer's categories) in %s's device memory; the CUDA context "
        "and cuBLASLt's 32 MiB workspace besides\n",
        device.c_str());
  }
  row("parameters", m.parameters + m.compute_copies,
      in.lora_base_bf16
          ? "the frozen base's matmul weights in bf16 only " + bytes(m.compute_copies) +
                " (lora.base_dtype" + (fsdp ? "; this rank's shards" : "") +
                "), its norms and embedding and the adapter in fp32"
          : std::string(fsdp && in.mesh.ep > 1
                            ? "this rank's shards (of its experts over the " +
                                  std::to_string(in.mesh.dp_shard / in.mesh.ep) +
                                  " ranks holding them, of the rest over dp_shard)"
                        : fsdp ? "this rank's shards"
                               : "fp32") +
                (m.compute_copies > 0
                     ? " + bf16 copies of the [norm, lm_head] unit's matmul weights " +
                           bytes(m.compute_copies)
                     : ""));
  const bool lora = in.lora.rank > 0;
  row("gradients", m.gradients,
      lora ? "the LoRA adapter's only (" + bytes(m.lora_parameters) + " of parameters, rank " +
                 std::to_string(in.lora.rank) + "): the model's weights are frozen"
           : (fsdp ? "this rank's shards" : "fp32"));
  row("optimizer", m.optimizer,
      lora ? "AdamW moments of the adapter"
           : (fsdp ? "AdamW moments of the shards" : "AdamW moments"));
  if (lora) {
    row("saved by LoRA", m.lora_saved,
        "the gradients and AdamW moments full fine-tuning would hold beyond the adapter's");
  }
  if (fsdp) {
    row("units in flight", m.units_in_flight + m.collective_buffers,
        "whole parameters and gradients at most at once (fsdp_reshard_after_forward = \"" +
            in.reshard_after_forward + "\"; peaks " + bytes(m.unit_parameters) + " and " +
            bytes(m.unit_gradients) + "); reduced shard and bf16 send rows " +
            bytes(m.collective_buffers) + " (other)");
  } else if (m.block_copies > 0) {
    row("block in flight", m.block_copies,
        "one block's bf16 copies of its matmul weights, made at each of its uses in one buffer "
        "held from the first step (parameters)");
  }
  // What a LoRA run drops beyond what its mode says (selective op says it already).
  const bool lora_remakes_norms = in.lora.rank > 0 && in.checkpointing.lora_remakes_norms() &&
                                  !in.checkpointing.remakes_norms();
  row("activations", m.activations,
      config_spelling(in.checkpointing) + " (none: " + bytes(m.activations_none) + ", full: " +
          bytes(m.activations_full) + "; the lm_head's logits chunk reuses the layers' scratch" +
          (lora_remakes_norms ? "; LoRA keeps no RMSNorm outputs, made again in the backward"
                              : "") +
          (m.expert_parallel_rooms > 0
               ? "; of them " + bytes(m.expert_parallel_rooms) + " the rooms for up to " +
                     std::to_string(m.expert_parallel_rows) +
                     " rows arriving at this rank's experts per sparse layer (ep x tokens x "
                     "min(top_k, experts / ep): whatever the routing)"
               : std::string()) +
          ")");
  row("other", m.rope + m.lora_scratch,
      m.lora_scratch > 0
          ? "RoPE tables " + bytes(m.rope) + " + LoRA's scratch " + bytes(m.lora_scratch) +
                (in.lora.dropout > 0.0 ? " (with dropout's masked inputs)"
                                       : " (the merged expert weights and their gradients, one "
                                         "sparse layer's, shared)")
          : std::string("RoPE tables"));
  row("step peak", m.step_peak(),
      fsdp                 ? "resident + the units in flight at their most"
      : m.block_copies > 0 ? "everything resident + one block's bf16 copies"
                           : "everything resident");
  if (in.checkpoint_saves) {
    row("checkpoint save", m.checkpoint_peak(),
        "between steps + the writer's staging " + bytes(m.writer_staging) +
            (m.checkpoint_gather > 0
                 ? " + one tensor gathered whole onto rank 0 at most " + bytes(m.checkpoint_gather)
                 : ""));
  }
  if (in.export_hf) {
    row("final export", m.export_peak(),
        std::string("checkpoint.last_save_in_hf: ") +
            (fsdp && in.lora_base_bf16 && m.export_gather > 0
                 ? "the bf16 shards widened to fp32 and one unit's parameters gathered to rank 0 "
                   "at most " +
                       bytes(m.export_gather) + " + "
             : fsdp || in.mesh.tp > 1 || in.mesh.ep > 1
                 ? "one unit's parameters gathered to rank 0 at most " + bytes(m.export_gather) +
                       " + "
             : in.lora_base_bf16 && m.export_gather > 0
                 ? "the bf16 base widened to fp32 masters " + bytes(m.export_gather) + " + "
                 : "") +
            "the writer's staging " + bytes(m.writer_staging));
  }
  const int64_t peak = p.peak();
  const char* phase = peak == m.step_peak()                     ? "a step"
                      : in.export_hf && peak == m.export_peak() ? "the final export"
                                                                : "a checkpoint save";
  row("predicted peak", peak, std::string("during ") + phase);

  const CommPlan& c = p.comm;
  std::printf("\nper step per rank\n");
  std::printf("  %-22s %10.4g  (%.4g per token, model FLOPs as MFU counts them)\n", "FLOPs",
              p.flops_per_step_rank, p.flops_per_token);
  if (fsdp) {
    row("all-gather", c.micro_batches * (c.all_gather_forward + c.all_gather_backward),
        "per micro-batch: forward " + bytes(c.all_gather_forward) + ", backward " +
            bytes(c.all_gather_backward));
    row("reduce-scatter", c.micro_batches * c.reduce_scatter,
        "per micro-batch " + bytes(c.reduce_scatter) + " (gradients)");
  }
  if (in.mesh.dp_replicate > 1 || (in.mesh.ep > 1 && !fsdp)) {
    row("all-reduce", c.all_reduce,
        in.mesh.ep > 1 && !fsdp
            ? "the gradients, once a step: the experts' over the ranks holding the same experts, "
              "the others' over every data-parallel rank"
        : fsdp ? "the shards' gradients over the replicas, once a step"
               : "the gradients, once a step");
  }
  row("communication", c.per_step(),
      in.mesh.world() == 1
          ? "one process"
          : "of the parameters and gradients, sent by each rank (ring algorithms)");
  if (c.rows.empty()) return;
  std::printf(
      "\ncollectives per step per rank, by group (bytes: each call's buffer on the rank, as titan "
      "train's end-of-run report measures them)\n");
  for (const CommRow& r : c.rows) {
    std::printf("  %-13s %-15s %12s %10s  %s\n", r.group.c_str(), collective_name(r.collective),
                count(r.calls, "call ", "calls").c_str(), bytes(r.bytes).c_str(), r.what.c_str());
  }
}

nlohmann::json to_json(const TrainingPlan& p, const std::string& model) {
  const PlanInputs& in = p.inputs;
  const MemoryPlan& m = p.memory;
  const CommPlan& c = p.comm;
  nlohmann::json collectives = nlohmann::json::array();
  for (const CommRow& r : c.rows) {
    collectives.push_back({{"group", r.group},
                           {"collective", collective_name(r.collective)},
                           {"calls", r.calls},
                           {"bytes", r.bytes},
                           {"what", r.what}});
  }
  nlohmann::json step = nlohmann::json::object();
  const auto by_category = m.step_by_category();
  for (int i = 0; i < kMemCategoryCount; ++i) {
    step[std::string(mem_category_name(static_cast<MemCategory>(i)))] = by_category[i];
  }
  return {
      {"model", model},
      {"architecture", in.args.architecture},
      {"parameters", p.parameter_count},
      {"ranks", in.mesh.world()},
      {"dp_replicate", in.mesh.dp_replicate},
      {"dp_shard", in.mesh.dp_shard},
      {"tp", in.mesh.tp},
      {"ep", in.mesh.ep},
      {"micro_batches", in.accumulation_steps},
      {"local_batch_size", in.local_batch_size},
      {"seq_len", in.seq_len},
      {"tokens_per_step", p.tokens_per_step},
      {"activation_checkpointing", in.checkpointing.name()},
      {"memory_bytes",
       {{"parameters", m.parameters},
        {"compute_copies", m.compute_copies},
        {"block_copies", m.block_copies},
        {"gradients", m.gradients},
        {"optimizer", m.optimizer},
        {"lora_rank", in.lora.rank},
        {"lora_parameters", m.lora_parameters},
        {"lora_saved", m.lora_saved},
        {"unit_parameters", m.unit_parameters},
        {"unit_gradients", m.unit_gradients},
        {"units_in_flight", m.units_in_flight},
        {"collective_buffers", m.collective_buffers},
        {"activations", m.activations},
        {"activations_none", m.activations_none},
        {"activations_full", m.activations_full},
        {"expert_parallel_rooms", m.expert_parallel_rooms},
        {"expert_parallel_rows", m.expert_parallel_rows},
        {"rope", m.rope},
        {"writer_staging", m.writer_staging},
        {"export_gather", m.export_gather},
        {"checkpoint_gather", m.checkpoint_gather},
        {"step_by_category", step},
        {"step_peak", m.step_peak()},
        {"checkpoint_peak", in.checkpoint_saves ? nlohmann::json(m.checkpoint_peak()) : nullptr},
        {"export_peak", in.export_hf ? nlohmann::json(m.export_peak()) : nullptr},
        {"peak", p.peak()}}},
      {"flops_per_token", p.flops_per_token},
      {"flops_per_step_per_rank", p.flops_per_step_rank},
      {"communication_bytes_per_rank",
       {{"all_gather_forward_per_micro_batch", c.all_gather_forward},
        {"all_gather_backward_per_micro_batch", c.all_gather_backward},
        {"reduce_scatter_per_micro_batch", c.reduce_scatter},
        {"all_reduce_per_step", c.all_reduce},
        {"per_step", c.per_step()}}},
      {"collectives_per_step", collectives},
  };
}

}  // namespace

Action add_plan_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "plan",
      "what a training job would take per rank: memory by category and its peak, FLOPs and "
      "communication per step (train's config flags; reads no data but, for a fine-tune, its first "
      "record; allocates no model)");
  static JobConfigFlags config_flags;
  static int nproc = 1;
  static bool json = false;
  static int threads;
  add_threads_option(*command, threads);
  const CLI::Option* threads_option = command->get_option("--threads");
  add_job_config_options(*command, config_flags);
  command->add_option("--nproc", nproc, "ranks the job would run on (the mesh as titan train)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command->add_flag("--json", json, "print the plan as one JSON object (bytes)");
  return [command, threads_option] {
    // Each rank's threads as titan train would set them with the job's ranks on this machine
    // (titan launch): per-thread scratch (the bf16 loss's widened rows) is part of the peak.
    set_thread_count(threads_option->count() > 0 ? threads : std::max(1, threads / nproc));
    std::vector<std::string> defaults_applied;
    const JobConfig config = job_config_from_flags(*command, config_flags, defaults_applied);
    // On stderr, as the warnings: stdout holds the plan (one JSON object with --json).
    for (const std::string& line : defaults_applied) std::fprintf(stderr, "%s\n", line.c_str());
    for (const std::string& line : job_config_unused_keys(config)) {
      std::fprintf(stderr, "warning: %s\n", line.c_str());
    }
    const PlanInputs inputs = plan_inputs(config, nproc);
    for (const std::string& line : job_model_unused_keys(config, inputs.args)) {
      std::fprintf(stderr, "warning: %s\n", line.c_str());
    }
    for (const std::string& line : inputs.override_warnings) {
      std::fprintf(stderr, "warning: %s\n", line.c_str());
    }
    const TrainingPlan plan = plan_training(inputs);
    const std::string model = config.model.flavor == "hf"
                                  ? config.model.hf_assets_path + "/config.json"
                                  : config.model.flavor;
    if (json) {
      std::printf("%s\n", to_json(plan, model).dump().c_str());
    } else {
      print_text(plan, model, config.training.device);
    }
    return 0;
  };
}

}  // namespace titan::cli
