#include "titan/models/causal_lm.h"

#include "titan/core/error.h"
#include "titan/models/registry.h"

namespace titan {

const char* describe_compute_dtype(DType compute) {
  return compute == DType::bf16 ? "matmuls in bf16 with fp32 accumulation, the rest in fp32"
                                : "fp32 throughout";
}

int64_t CausalLM::parameter_count() const {
  int64_t n = 0;
  for (const ParamGroup& g : param_groups()) {
    for (const ParamView& v : g.views()) n += v.numel;
  }
  return n;
}

void CausalLM::zero_gradients() {
  for (ParamGroup& g : param_groups()) g.zero_gradients();
}

std::unique_ptr<CausalLM> make_model(const ModelArgs& args,
                                     const std::vector<OverrideRule>& overrides,
                                     DType compute_dtype, Residency params) {
  return model_family(args.architecture, "model").make(args, overrides, compute_dtype, params);
}

}  // namespace titan
