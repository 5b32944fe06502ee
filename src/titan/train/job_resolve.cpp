#include "titan/train/job_resolve.h"

#include <algorithm>
#include <string>

#include "titan/core/error.h"
#include "titan/dispatch/plugin.h"
#include "titan/models/hf_config.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/models/registry.h"

namespace titan {

ModelArgs resolve_job_model_args(const JobConfig& c) {
  ModelArgs args;
  if (c.model.flavor == "hf") {
    TITAN_CHECK(!c.model.hf_assets_path.empty(),
                "model.flavor = \"hf\" needs model.hf_assets_path (a Hugging Face model folder)");
    args = read_hf_config(c.model.hf_assets_path);
    args.attn_backend = c.model.attn_backend;
  } else {
    args = flavor(c.model.flavor, c.model.attn_backend);
  }
  // model.name picks the family of a built-in flavor; a folder names its own, which an explicit
  // model.name must agree with.
  const bool name_set =
      std::find(c.set_keys.begin(), c.set_keys.end(), "model.name") != c.set_keys.end();
  const std::string family = model_family(args.architecture, "model").name;
  TITAN_CHECK(family == c.model.name || (c.model.flavor == "hf" && !name_set), "model.name '",
              c.model.name, "' does not match ",
              c.model.flavor == "hf" ? c.model.hf_assets_path + "/config.json"
                                     : "flavor '" + c.model.flavor + "'",
              ", a ", args.architecture, " (model.name '", family, "')");
  args.output_router_logits = args.output_router_logits || c.model.output_router_logits;
  TITAN_CHECK(c.training.seq_len <= args.max_position_embeddings, "training.seq_len (",
              c.training.seq_len, ") exceeds the model's max_position_embeddings (",
              args.max_position_embeddings, ")");
  validate_model_args(args, "model flavor '" + c.model.flavor + "'");
  return args;
}

ParallelDegrees job_parallel_degrees(const JobConfig& c) {
  const JobConfig::Parallelism& p = c.parallelism;
  return {p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree,
          p.pipeline_parallel_degree,       p.context_parallel_degree,    p.expert_parallel_degree};
}

int64_t job_accumulation_steps(const JobConfig& c, const MeshDims& dims) {
  const JobConfig::Training& t = c.training;
  const int64_t dp = dims.dp();
  const int64_t global_batch =
      t.global_batch_size == -1 ? t.local_batch_size * dp : t.global_batch_size;
  TITAN_CHECK(global_batch % (t.local_batch_size * dp) == 0, "training.global_batch_size (",
              global_batch, ") is not a multiple of local_batch_size x data-parallel ranks (",
              t.local_batch_size, " x ", dp, ")");
  return global_batch / (t.local_batch_size * dp);
}

DType job_compute_dtype(const JobConfig& c) {
  return c.training.mixed_precision_param == "bfloat16" ? DType::bf16 : DType::f32;
}

JobKernels resolve_job_kernels(const JobConfig& c) {
  JobKernels kernels;
  if (!c.experimental.custom_import.empty()) {
    kernels.plugin_kernels = load_kernel_plugin(c.experimental.custom_import);
  }
  for (const auto& [pattern, kernel] : c.overrides) kernels.overrides.push_back({pattern, kernel});
  return kernels;
}

}  // namespace titan
