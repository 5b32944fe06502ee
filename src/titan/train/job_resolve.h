// What a JobConfig resolves to before anything is read or allocated, shared by `titan train` and
// `titan plan`, so both accept and refuse the same configs with the same lines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/dispatch/overrides.h"
#include "titan/distributed/mesh.h"
#include "titan/models/model_args.h"
#include "titan/train/job_config.h"

namespace titan {

// The defaults that depend on a config's inputs, applied to the keys its TOML file and command
// line leave unset, before anything else resolves it -- today a Hugging Face folder given under
// `preset` without a model is fine-tuned (train/job_finetune.h). `titan train` and `titan plan`
// apply them once, to the validated config. Returns the start-up lines saying what was applied.
std::vector<std::string> resolve_job_defaults(JobConfig& config, std::string_view preset);
// The model's arguments: a built-in flavor, or model.hf_assets_path's config.json with
// model.flavor = "hf"; model.name checked against the family, model.output_router_logits applied,
// training.seq_len checked against the positions, the whole validated. The tokenizer's vocabulary
// is checked against it by the trainer, which loads the tokenizer.
ModelArgs resolve_job_model_args(const JobConfig& config);
// [parallelism]'s degrees as configured (resolve_mesh_dims resolves them against a world).
ParallelDegrees job_parallel_degrees(const JobConfig& config);
// Micro-batches each data-parallel rank runs per step: global_batch_size (-1: local_batch_size x
// dp) / (local_batch_size x dp); a global batch that does not divide is a titan::Error.
int64_t job_accumulation_steps(const JobConfig& config, const MeshDims& dims);
// The most bytes (or tokens) per rank titan plans or allocates for: 2^60, 1 EiB. Every figure of
// a job below it is counted exactly in int64_t; one beyond it is refused, not wrapped.
constexpr int64_t kMaxJobBytes = int64_t{1} << 60;
// titan::Error naming the keys unless every figure of the job fits under kMaxJobBytes -- its
// parameters' bytes, its activations' (training.seq_len x local_batch_size x the layers), the
// tokens of a step and the bytes a rank sends in one -- checked in long double against bounds
// above the real figures, before titan plan or titan train computes them in int64_t.
void check_job_sizes(const JobConfig& config, const ModelArgs& args, const MeshDims& dims);
// What a tensor-parallel job (parallelism.tensor_parallel_degree > 1) cannot do yet, each refused
// with one line naming the key: sequence parallel on a seq_len the degree does not divide, LoRA
// merged on export or over a base held in bf16 (before the mesh is made). Nothing without TP.
void check_tensor_parallel_job(const JobConfig& config);
// What an expert-parallel job (dims.ep > 1) cannot do yet, each refused with one line naming the
// key: an EP degree that is not a multiple of the TP degree, LoRA on the experts (an adapter of
// the attention only is built). Nothing without EP.
// check_tensor_parallel_model: under TP x EP, a model with experts with a seq_len the TP degree
// does not divide (TP without EP cuts every expert).
void check_expert_parallel_job(const JobConfig& config, const MeshDims& dims);
void check_tensor_parallel_model(const JobConfig& config, const ModelArgs& args,
                                 const MeshDims& dims);
// The bounds check_job_sizes holds to kMaxJobBytes (tests/unit/test_training_plan.cpp checks each
// lies above the plan's real figure).
struct JobSizeBounds {
  long double per_layer = 0, parameters = 0;                              // elements
  long double parameter_bytes = 0, activation_bytes = 0, sent_bytes = 0;  // per rank
  long double global_batch = 0, step_tokens = 0;
};
JobSizeBounds job_size_bounds(const JobConfig& config, const ModelArgs& args, const MeshDims& dims);
// Warnings for the keys set (JobConfig::set_keys) that have no effect on a world of `world_size`
// ranks resolved to `dims`: comm.init_timeout_seconds / train_timeout_seconds /
// heartbeat_timeout_seconds in one process (no collectives), parallelism.fsdp_reshard_after_forward
// without FSDP (dp_shard 1).
std::vector<std::string> job_world_unused_keys(const JobConfig& config, const MeshDims& dims,
                                               int64_t world_size);
// Warnings for what the config asks that has no effect on the model `args`: a selective
// activation_checkpoint.selective_ac_option "N" above its layer count recomputes no layer (the
// run is mode "none"'s; torchtitan accepts it without a word).
std::vector<std::string> job_model_unused_keys(const JobConfig& config, const ModelArgs& args);
// The dtype the model's matmuls compute in: bf16 under training.mixed_precision_param =
// "bfloat16", else fp32.
DType job_compute_dtype(const JobConfig& config);

// The job's kernels: experimental.custom_import's plugin loaded into the kernel registry (the
// kernels it added, for the start-up log; none without a plugin; a bad plugin is a titan::Error
// naming it), and [overrides] as rules in the config's order, for make_model or
// decoder_lm_overrides to apply.
struct JobKernels {
  std::vector<std::string> plugin_kernels;
  std::vector<OverrideRule> overrides;
};
JobKernels resolve_job_kernels(const JobConfig& config);

}  // namespace titan
