// Training FLOPs per token, the MFU numerator (qwen3-spec.md section 6; docs/PERFORMANCE.md):
//   6 * N_mm + 12 * L * H * hd * T
// N_mm counts every parameter that takes part in a matmul per token: attention and MLP
// projections (for MoE the router and the k active experts), and the lm_head even when it is
// tied to the embedding; the embedding gather is not a matmul. The attention term (QK^T and PV,
// forward and backward) gets no credit for causal masking, as in PaLM and torchtitan. Counted over
// the parameter specs cut by a parallelize plan: one rank's share of a token's FLOPs (the default
// plan: the whole model's), so MFU on a tensor-parallel rank is its own tokens/s times its share,
// which is torchtitan's whole-model FLOPs times tokens/s over the non-data-parallel ranks.
#pragma once

#include <cstdint>

#include "titan/models/model_args.h"
#include "titan/nn/parallel_plan.h"

namespace titan {

double training_flops_per_token(const ModelArgs& args, int64_t seq_len,
                                const ParallelizePlan& plan = {});

}  // namespace titan
