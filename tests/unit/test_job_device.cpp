// training.device: its values, the features a job on CUDA is refused with (one line each, before
// anything is allocated), and the one line a build or machine without the device gives.
#include <gtest/gtest.h>

#include <string>

#include "error_of.h"
#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/train/job_config.h"
#include "titan/train/job_device.h"

namespace titan {
namespace {

using test::error_of;

TEST(JobDevice, TrainingDeviceIsCpuCudaOrCudaN) {
  JobConfig c = job_config_preset("tiny");
  EXPECT_EQ(c.training.device, "cpu");
  for (const char* ok : {"cpu", "cuda", "cuda:0", "cuda:7"}) {
    job_config_apply_override(c, std::string("--training.device=") + ok);
    EXPECT_NO_THROW(job_config_validate(c)) << ok;
  }
  job_config_apply_override(c, "--training.device=gpu");
  EXPECT_EQ(error_of([&] { job_config_validate(c); }),
            "training.device: unknown device 'gpu' (cpu, cuda or cuda:N)");
  job_config_apply_override(c, "--training.device=cuda:one");
  EXPECT_EQ(error_of([&] { job_config_validate(c); }),
            "training.device: unknown device 'cuda:one' (cpu, cuda or cuda:N)");
}

// A build without CUDA or a machine without a GPU: one line naming the key and which; the CPU
// stays the ops' backend. (Where both are there, the device is selected, then the CPU again.)
TEST(JobDevice, NoSuchDeviceIsOneLineNamingTheKey) {
  JobConfig c = job_config_preset("tiny");
  c.training.device = "cuda:3";
  try {
    select_job_device(c);
    EXPECT_EQ(backend().kind(), DeviceKind::cuda);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.rfind("training.device = \"cuda:3\": this titan was built without CUDA (", 0) ==
                    0 ||
                m.rfind("training.device = \"cuda:3\": no CUDA device", 0) == 0)
        << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  c.training.device = "cpu";
  select_job_device(c);
  EXPECT_EQ(&backend(), &backend_named("cpu"));
}

// The fp32 and bf16 step of one process, dense or MoE, is what CUDA takes so far; each other
// feature is refused by name. On the CPU none is.
TEST(JobDevice, CudaRefusesWhatItCannotRunYet) {
  const JobConfig base = [] {
    JobConfig c = job_config_preset("tiny");
    c.training.device = "cuda";
    c.checkpoint.enable = false;
    c.checkpoint.last_save_in_hf = false;
    return c;
  }();
  const ModelArgs dense = flavor("tiny");
  const MeshDims one;
  EXPECT_NO_THROW(check_device_job(base, dense, one));
  const std::string prefix = "training.device = \"cuda\": ";
  const auto refused = [&](const JobConfig& c, const ModelArgs& args, const MeshDims& dims) {
    const std::string m = error_of([&] { check_device_job(c, args, dims); });
    EXPECT_EQ(m.rfind(prefix, 0), 0u) << m;
    EXPECT_NE(m.find(" is not implemented on CUDA yet ("), std::string::npos) << m;
    // The CPU takes the same job.
    JobConfig cpu = c;
    cpu.training.device = "cpu";
    EXPECT_NO_THROW(check_device_job(cpu, args, dims));
    return m.substr(prefix.size(), m.find(" is not") - prefix.size());
  };
  {
    // A MoE model's kernels and load-balancing DeviceOps have CUDA forms
    // (titan_cuda_step_kernels_check), in fp32 and bf16; expert parallel stays refused below.
    EXPECT_NO_THROW(check_device_job(base, flavor("tiny_moe"), one));
    JobConfig c = base;
    c.training.mixed_precision_param = "bfloat16";
    EXPECT_NO_THROW(check_device_job(c, flavor("tiny_moe"), one));
  }
  {
    // Every kernel the bf16 step binds has its CUDA bf16 forms (titan_cuda_step_kernels_check).
    JobConfig c = base;
    c.training.mixed_precision_param = "bfloat16";
    EXPECT_NO_THROW(check_device_job(c, dense, one));
  }
  {
    // LoRA on a dense model: its dropout and B's transpose are CUDA DeviceOps, its rooms the
    // backend's memory; on a MoE model, and merging or holding the base in bf16, refused.
    JobConfig c = base;
    c.lora.rank = 8;
    c.lora.dropout = 0.1;
    EXPECT_NO_THROW(check_device_job(c, dense, one));
    c.training.mixed_precision_param = "bfloat16";
    EXPECT_NO_THROW(check_device_job(c, dense, one));
    EXPECT_EQ(refused(c, flavor("tiny_moe"), one), "LoRA on a MoE model (its experts' merge)");
    c.lora.merge_on_export = true;
    EXPECT_EQ(refused(c, dense, one), "lora.merge_on_export (the merge runs on the host)");
    c.lora.merge_on_export = false;
    c.lora.base_dtype = "bfloat16";
    EXPECT_EQ(refused(c, dense, one),
              "lora.base_dtype = \"bfloat16\" (its bf16 base is loaded on the host)");
  }
  {
    // The bias DeviceOps are CUDA's own (the CPU's additions in its order).
    ModelArgs biased = dense;
    biased.attention_bias = biased.o_proj_bias = biased.mlp_bias = true;
    EXPECT_NO_THROW(check_device_job(base, biased, one));
  }
  MeshDims tp, ep, fsdp, ddp;
  tp.tp = 2;
  ep.dp_shard = 2;
  ep.ep = 2;
  fsdp.dp_shard = 2;
  ddp.dp_replicate = 2;
  EXPECT_EQ(refused(base, dense, tp), "tensor parallel (parallelism.tensor_parallel_degree > 1)");
  EXPECT_EQ(refused(base, dense, ep), "expert parallel (parallelism.expert_parallel_degree > 1)");
  EXPECT_EQ(refused(base, flavor("tiny_moe"), ep),
            "expert parallel (parallelism.expert_parallel_degree > 1)");
  EXPECT_EQ(refused(base, dense, fsdp), "FSDP (parallelism.data_parallel_shard_degree > 1)");
  EXPECT_EQ(refused(base, dense, ddp),
            "data parallel over replicas (parallelism.data_parallel_replicate_degree > 1)");
  {
    // Both saves and the export read the device's state through the backend's copies.
    JobConfig c = base;
    c.checkpoint.enable = true;
    for (const char* mode : {"disabled", "async"}) {
      c.checkpoint.async_mode = mode;
      EXPECT_NO_THROW(check_device_job(c, dense, one)) << mode;
    }
    c.checkpoint.last_save_in_hf = true;
    EXPECT_NO_THROW(check_device_job(c, dense, one));
  }
  {
    // Loaded into host copies, copied in (nn/host_params.h).
    JobConfig c = base;
    c.checkpoint.initial_load_path = "somewhere/step-10";
    EXPECT_NO_THROW(check_device_job(c, dense, one));
    c.checkpoint.initial_load_in_hf = true;
    EXPECT_NO_THROW(check_device_job(c, dense, one));
  }
  EXPECT_EQ(refused(base, flavor("tiny", "reference"), one),
            "model.attn_backend other than blockwise (it names the CPU's attention kernels)");
}

}  // namespace
}  // namespace titan
