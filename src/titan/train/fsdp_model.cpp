#include "titan/train/fsdp_model.h"

namespace titan {

void shard_model(CausalLM& model, FullyShardedGroups& fsdp) {
  const bool bf16 = model.compute_dtype() == DType::bf16;
  if (bf16) fsdp.gather_in_bf16(model.bf16_only_params(), model.copied_params());
  FullyShardedGroups* f = &fsdp;
  model.set_param_group_hooks(
      {[f](int64_t g, bool grads, GroupReads reads) { f->acquire(g, grads, reads); },
       [f](int64_t g, GroupUseEnd end) { f->release(g, end); },
       [f](int64_t g, GroupReads reads) { f->prefetch(g, reads); }, bf16});
}

std::vector<std::vector<std::string>> bf16_only_param_names(CausalLM& model) {
  std::vector<std::vector<std::string>> names;
  for (const std::vector<ComputeCopyTarget>& group : model.bf16_only_params()) {
    names.emplace_back();
    for (const ComputeCopyTarget& t : group) names.back().push_back(t.param);
  }
  return names;
}

}  // namespace titan
