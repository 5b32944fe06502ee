// Qwen3-MoE's sparse block as two ops (qwen3-spec.md §2.2, Transformers' Qwen3MoeTopKRouter and
// Qwen3MoeExperts): the router's softmax and top-k, and the grouped experts, each token's output
// the routing-weighted sum of its k experts' SwiGLU MLPs. The router's projection is a linear
// (ops/linear.h). Also the Switch-Transformer load-balancing loss of Qwen3MoeForCausalLM (§2.3).
// The experts compute in fp32, or for mixed precision with bf16 GEMM operands and fp32
// accumulation (the *_bf16 kernels); the router always computes in fp32. The same experts split
// into stages, where expert parallel cuts them (dispatch, grouped compute, combine), are
// ops/moe_stages.h; they equal the fused kernels below bit for bit.
#pragma once

#include <cstdint>
#include <string>

namespace titan {

// probs (N, E) = softmax(logits (N, E)) in fp32. index, weight (N, k): the k largest
// probabilities in descending order (ties: the lower expert first, as torch.topk), divided by
// their sum when norm_topk_prob. A top_k outside [1, E] is a titan::Error.
void router_topk_forward(int32_t* index, float* weight, float* probs, const float* logits,
                         int64_t n_tokens, int64_t n_experts, int64_t top_k, bool norm_topk_prob);
// dlogits (N, E), overwritten, from dweight (N, k) through the renormalisation and the softmax;
// dprobs_all (E), optional, is added to d loss / d probs of every row (the load-balancing loss's
// gradient). The selection itself is piecewise constant and has no gradient.
void router_topk_backward(float* dlogits, const float* dweight, const float* dprobs_all,
                          const float* probs, const int32_t* index, int64_t n_tokens,
                          int64_t n_experts, int64_t top_k, bool norm_topk_prob);
// The same contracts with the softmax, the picking and the sums in fp64 (ops/moe_route.cpp).
void router_topk_forward_reference(int32_t* index, float* weight, float* probs, const float* logits,
                                   int64_t n_tokens, int64_t n_experts, int64_t top_k,
                                   bool norm_topk_prob);
void router_topk_backward_reference(float* dlogits, const float* dweight, const float* dprobs_all,
                                    const float* probs, const int32_t* index, int64_t n_tokens,
                                    int64_t n_experts, int64_t top_k, bool norm_topk_prob);

struct ExpertsShape {
  int64_t n_tokens = 0;   // N
  int64_t hidden = 0;     // h
  int64_t inter = 0;      // Im, one expert's SwiGLU width
  int64_t n_experts = 0;  // E
  int64_t top_k = 0;      // k
  int64_t rows() const { return n_tokens * top_k; }
};

// One layer's stacked experts (state_dict_adapter.h), expert e the slice [e].
struct ExpertWeights {
  const float* gate = nullptr;  // (E, Im, h)
  const float* up = nullptr;    // (E, Im, h)
  const float* down = nullptr;  // (E, h, Im)
};
// Their bf16 copies (raw bits), for mixed precision.
struct ExpertWeightsBf16 {
  const uint16_t* gate = nullptr;  // (E, Im, h)
  const uint16_t* up = nullptr;    // (E, Im, h)
  const uint16_t* down = nullptr;  // (E, h, Im)
};
// Each null when frozen (LoRA's base): the kernels then skip that weight gradient.
struct ExpertGrads {
  float* gate = nullptr;  // (E, Im, h), accumulated
  float* up = nullptr;    // (E, Im, h)
  float* down = nullptr;  // (E, h, Im)
};

// What the experts' backward needs: one row per routed (token, slot) pair, N*k rows in the
// kernel's own order (only the same kernel's backward reads them). act is not among them: the
// forward writes it for its down_proj GEMM, and the backward recomputes it from gate and up, bit
// for bit, so a model may point every layer's act at one room.
// The bf16 kernels keep gate and up as (N*k, Im) bf16 values, in the first half of each room (a
// bf16 model carves only that), rounded as a bf16 GEMM returns them (torch.autocast's gate_up_proj
// output), and compute act from those roundings, rounded as its GEMM takes it.
struct ExpertsActivations {
  float* gate = nullptr;       // (N*k, Im) gate_proj output
  float* up = nullptr;         // (N*k, Im)
  float* act = nullptr;        // (N*k, Im) silu(gate) * up, down_proj's input (scratch)
  int32_t* row_of = nullptr;   // (N*k) the row of (token t, slot j) at [t*k + j]
  int32_t* offsets = nullptr;  // (E + 1) expert e owns rows [offsets[e], offsets[e + 1])
};

// Scratch for the forward and the backward, needed only during one call. The bf16 kernels keep
// their rounded GEMM operands in this same room (ops/moe.cpp says where); a forward uses x and
// y, and with bf16 kernels dgate and dup (the gate and up GEMMs' fp32 outputs) when a backward
// follows. Inference leaves dgate and dup null: the bf16 forward then computes gate and up in
// the activations' rooms, in fp32, and keeps nothing for a backward.
struct ExpertsScratch {
  float* x = nullptr;      // (N*k, h) the routed tokens' inputs, gathered
  float* y = nullptr;      // (N*k, h) expert outputs; in the backward d y, then d x rows
  float* dgate = nullptr;  // (N*k, Im)
  float* dup = nullptr;    // (N*k, Im)
  float* dact = nullptr;   // (N*k, Im)
  // The staged experts' backward only (ops/moe_stages.h; null for the fused kernels and in
  // inference): each row's routing weight and d loss / d that weight, in row order, which travel
  // with the rows under expert parallel; and under bf16 the experts' outputs recomputed for
  // d weight, (N*k, h) fp32 that may lie in x's room past its bf16 rows.
  float* w_rows = nullptr;        // (N*k)
  float* dweight_rows = nullptr;  // (N*k)
  float* out = nullptr;           // (N*k, h), bf16 only
};

// y (N, h) = sum over slots j of weight[t, j] * expert_{index[t, j]}(x_t), x (N, h), index and
// weight (N, k); summed in ascending expert order, as Transformers' index_add_ loop. Every
// index must be in [0, E).
void experts_forward_grouped(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                             const float* x, const int32_t* index, const float* weight,
                             const ExpertWeights& w, const ExpertsShape& shape);
// dx (N, h) and dweight (N, k) overwritten; the expert gradients accumulated into dw.
void experts_backward_grouped(float* dx, float* dweight, const ExpertGrads& dw,
                              const ExpertsScratch& s, const float* dy,
                              const ExpertsActivations& act, const float* x, const int32_t* index,
                              const float* weight, const ExpertWeights& w,
                              const ExpertsShape& shape);

// Mixed precision, as PyTorch computes these experts with every GEMM's operands rounded to bf16
// and products accumulated in fp32: the gathered token rows, gate and up, and down_proj's input
// silu(gate) * up are rounded in the forward, and each GEMM's output gradient in the backward
// (weight * dy for down_proj, d gate and d up for gate_proj and up_proj); down_proj's output,
// gradients, SwiGLU's arithmetic, the routing weights and the weighted sum stay fp32. d weight is
// <dy, the expert's fp32 output>, which the backward recomputes (one more GEMM) rather than keep
// N*k rows of h per layer.
void experts_forward_grouped_bf16(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                                  const float* x, const int32_t* index, const float* weight,
                                  const ExpertWeightsBf16& w, const ExpertsShape& shape);
void experts_backward_grouped_bf16(float* dx, float* dweight, const ExpertGrads& dw,
                                   const ExpertsScratch& s, const float* dy,
                                   const ExpertsActivations& act, const float* x,
                                   const int32_t* index, const float* weight,
                                   const ExpertWeightsBf16& w, const ExpertsShape& shape);

// The same contracts token by token with fp64 sums (rows in (token, slot) order).
void experts_forward_reference(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                               const float* x, const int32_t* index, const float* weight,
                               const ExpertWeights& w, const ExpertsShape& shape);
void experts_backward_reference(float* dx, float* dweight, const ExpertGrads& dw,
                                const ExpertsScratch& s, const float* dy,
                                const ExpertsActivations& act, const float* x, const int32_t* index,
                                const float* weight, const ExpertWeights& w,
                                const ExpertsShape& shape);
void experts_forward_bf16_reference(float* y, const ExpertsActivations& act,
                                    const ExpertsScratch& s, const float* x, const int32_t* index,
                                    const float* weight, const ExpertWeightsBf16& w,
                                    const ExpertsShape& shape);
void experts_backward_bf16_reference(float* dx, float* dweight, const ExpertGrads& dw,
                                     const ExpertsScratch& s, const float* dy,
                                     const ExpertsActivations& act, const float* x,
                                     const int32_t* index, const float* weight,
                                     const ExpertWeightsBf16& w, const ExpertsShape& shape);
// Empty when N*k rows fit the kernels' int32 row numbers, else the violated constraint.
std::string experts_check_rows(const ExpertsShape& shape);

// Load balancing over all sparse layers' rows together (Transformers' load_balancing_loss_func
// without an attention mask): counts (E) tokens routed to each expert and prob_sums (E) the
// summed router probabilities, both over `rows` (layer, token) rows;
//   aux = E * sum_e (counts_e / rows) * (prob_sums_e / rows).
void load_balancing_accumulate(double* counts, double* prob_sums, const float* probs,
                               const int32_t* index, int64_t n_tokens, int64_t n_experts,
                               int64_t top_k);
double load_balancing_loss(const double* counts, const double* prob_sums, int64_t n_experts,
                           int64_t rows);
// dprobs (E) = scale * d aux / d probs[t, e], the same for every row t: scale * E * counts_e /
// rows^2 (the counts are piecewise constant).
void load_balancing_grad(float* dprobs, const double* counts, int64_t n_experts, int64_t rows,
                         double scale);

}  // namespace titan
