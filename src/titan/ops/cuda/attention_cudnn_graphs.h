// cuDNN's graphs for causal GQA attention (attention_cudnn.cpp), described apart from building
// and running them so that titan_cudnn_attention_graphs_check validates each description on a
// host without a GPU (the frontend's support checks for a given SM) before a GPU runs them.
#pragma once

#include <cstdint>
#include <memory>

#include <cudnn_frontend.h>

#include "titan/ops/cuda/attention_cudnn_plan.h"

namespace titan::cudnn_attention {

// The graphs' tensors, named by uid in each call's variant pack.
namespace uid {
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };
}

// The forward (q, k, v -> O and the softmax statistics) or backward (q, k, v, O, dO, the
// statistics -> dQ, dK, dV) of `key`, over titan's row layouts (ops/attention.h): bf16 io, fp32
// intermediates and compute, the square causal mask, scale 1 / sqrt(head_dim). Described only:
// the caller validates, builds and runs it. `sm_version` (e.g. 90): the GPU it is for, without one
// present; 0: the current device's, read when the graph is validated.
std::unique_ptr<cudnn_frontend::graph::Graph> describe_graph(const GraphKey& key,
                                                             int32_t sm_version = 0);

}  // namespace titan::cudnn_attention
