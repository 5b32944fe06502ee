#include "titan/models/causal_lm.h"

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

}  // namespace titan
