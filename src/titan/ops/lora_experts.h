// LoRA on a stacked expert weight, as PEFT's ParamWrapper computes it (peft/tuners/lora/layer.py,
// Transformers 5's fused experts): the weight W (E, out, in) is used as W + scaling * B_e A_e per
// expert, the adapter's A (E * rank, in) holding expert e's (rank, in) in rows [e rank, (e + 1)
// rank) and B (out, rank * E) expert e's (out, rank) in the columns j E + e (PEFT's reshape to
// (out, rank, E)). The merged weight is what the experts' GEMMs read; the backward takes the
// gradient of the merged weight and gives A's and B's, dB_e = scaling * dW_e A_e^T and
// dA_e = scaling * B_e^T dW_e.
//
// `b` may point into B's rows (gate_up_proj's B is (2 Im, rank * E): gate's rows, then up's), its
// row stride staying rank * E; `db` likewise.
#pragma once

#include <cstdint>

namespace titan {

struct ExpertLoraShape {
  int64_t n_experts = 0;  // E
  int64_t rank = 0;       // per expert
  int64_t in = 0, out = 0;
  float scaling = 0.0f;
};

// w_merged (E, out, in) = w (E, out, in) + scaling * B_e A_e, the product summed in fp32.
void expert_lora_merge(float* w_merged, const float* w, const float* a, const float* b,
                       const ExpertLoraShape& shape);
// da (E rank, in) and db (out rows of rank * E) += the gradients from dw (E, out, in).
void expert_lora_backward(float* da, float* db, const float* dw, const float* a, const float* b,
                          const ExpertLoraShape& shape);

// The same contracts as plain loops over PEFT's index formula, summed in fp64.
void expert_lora_merge_reference(float* w_merged, const float* w, const float* a, const float* b,
                                 const ExpertLoraShape& shape);
void expert_lora_backward_reference(float* da, float* db, const float* dw, const float* a,
                                    const float* b, const ExpertLoraShape& shape);

}  // namespace titan
