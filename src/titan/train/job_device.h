// training.device: the device a job trains on. "cpu" (the default) or "cuda" / "cuda:N": its
// backend becomes the ops' (backend/backend.h), so parameters, gradients, AdamW state and
// activations are carved from that device's memory as on the CPU, and every kernel slot binds the
// device's kernels (dispatch/registry.h). CUDA takes one process training a dense model (Qwen2's
// linear biases included) in fp32 or bf16 mixed precision from fresh weights, a Hugging Face folder
// or a titan checkpoint, saving checkpoints (synchronous or asynchronous) and the final HF export
// through host staging; everything else is refused at start-up, one line each.
#pragma once

#include "titan/distributed/mesh.h"
#include "titan/models/model_args.h"
#include "titan/train/job_config.h"

namespace titan {

// Makes training.device the ops' backend; call before anything is allocated. titan::Error in one
// line naming the key where the build has no CUDA or the machine no such device.
void select_job_device(const JobConfig& config);

// What a job on a device other than the CPU cannot do yet: titan::Error naming the first feature
// the job asks for (a MoE model, LoRA, tensor / expert / data parallelism and FSDP, the reference
// attention kernel). Nothing on the CPU.
void check_device_job(const JobConfig& config, const ModelArgs& args, const MeshDims& dims);

}  // namespace titan
