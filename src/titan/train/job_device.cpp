#include "titan/train/job_device.h"

#include <string>

#include "titan/backend/allow_tf32.h"
#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {

void select_job_device(const JobConfig& config) {
  const std::string& device = config.training.device;
  try {
    select_backend(device);
  } catch (const Error& e) {
    fail("training.device = \"", device, "\": ", e.what());
  }
  set_allow_tf32(backend(), config.training.allow_tf32);
}

void check_device_job(const JobConfig& config, const ModelArgs& args, const MeshDims& dims) {
  const std::string& device = config.training.device;
  if (parse_device_name(device).kind == DeviceKind::cpu) return;
  // Each refusal says what to change; issue 41's later milestones lift them.
  const auto refuse = [&](bool asked, const char* what, const char* instead) {
    TITAN_CHECK(!asked, "training.device = \"", device, "\": ", what,
                " is not implemented on CUDA yet (", instead, ")");
  };
  // LoRA on a dense model runs there (the adapter's GEMMs are the backend's; its dropout, B's
  // transpose and rooms CUDA's); on a MoE model's experts it needs the merge kernels CUDA lacks.
  refuse(args.is_moe() && config.lora.rank > 0, "LoRA on a MoE model (its experts' merge)",
         "adapt a dense model, or train on the CPU");
  // Both merge or load the frozen base with host loops over its weights.
  refuse(config.lora.rank > 0 && config.lora.merge_on_export,
         "lora.merge_on_export (the merge runs on the host)", "export the PEFT adapter");
  refuse(config.lora.rank > 0 && config.lora.base_dtype == "bfloat16",
         "lora.base_dtype = \"bfloat16\" (its bf16 base is loaded on the host)",
         "leave the base in float32");
  refuse(dims.tp > 1, "tensor parallel (parallelism.tensor_parallel_degree > 1)",
         "run one process");
  refuse(dims.ep > 1, "expert parallel (parallelism.expert_parallel_degree > 1)",
         "run one process");
  refuse(dims.dp_shard > 1, "FSDP (parallelism.data_parallel_shard_degree > 1)", "run one process");
  refuse(dims.dp_replicate > 1,
         "data parallel over replicas (parallelism.data_parallel_replicate_degree > 1)",
         "run one process");
  refuse(args.attn_backend != "blockwise",
         "model.attn_backend other than blockwise (it names the CPU's attention kernels)",
         "leave it unset: CUDA's attention is its own kernel");
}

}  // namespace titan
