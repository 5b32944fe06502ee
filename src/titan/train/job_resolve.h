// What a JobConfig resolves to before anything is read or allocated, shared by `titan train` and
// `titan plan`, so both accept and refuse the same configs with the same lines.
#pragma once

#include <cstdint>

#include "titan/dist/mesh.h"
#include "titan/models/model_args.h"
#include "titan/train/job_config.h"

namespace titan {

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

}  // namespace titan
