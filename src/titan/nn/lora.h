// LoRA (Hu et al. 2021, as PEFT computes it): a frozen linear y = x W^T + b plus a trained
// low-rank update, y += scaling * (x A^T) B^T, A (rank, in) and B (out, rank), scaling =
// alpha / rank. The update is attached to a `Linear` (nn/layers.h): linear_group_forward and
// linear_group_backward add it after the base product, through the linear's own kernel, so the
// low-rank GEMMs run wherever the base ones do, in fp32 or, when the base computes in bf16 (mixed
// precision), with bf16 operands as every other matmul there. The base weight has no gradient.
// With dropout (PEFT's lora_dropout) the update reads x masked, scaling * (dropout(x) A^T) B^T,
// and its dx share goes back through the same mask (ops/lora_dropout.h draws it again).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/dispatch/registry.h"
#include "titan/ops/lora_dropout.h"
#include "titan/ops/moe.h"

namespace titan {

// Whether the adapter's input is dropped out now (lora.dropout, ops/lora_dropout.h): set by the
// trainer around each training micro-batch's forward and backward, off otherwise (validation,
// titan eval and generate never drop out).
struct LoraDropout {
  double p = 0.0;  // lora.dropout
  bool on = false;
  uint64_t seed = 0;
  int64_t step = 0, first_row = 0, seq_len = 0;  // ops/lora_dropout.h's key
};

// Room the adapted linears of a model share (one runs at a time): the rank-wide products of a
// call and B transposed.
// The rank-wide rooms of one call, carved from LoraScratch::rank_rooms.
struct LoraRankRooms {
  float* low = nullptr;  // (2 N, rank): scaling * x A^T and scaling * dy B
  float* b_t = nullptr;  // (rank, out): B^T
  // bf16 compute: the rank-wide products rounded (2 N, rank), A (rank, in) and B (out, rank)
  // rounded at each call, and B^T (rank, out) rounded.
  uint16_t *low_bf16 = nullptr, *a_bf16 = nullptr, *b_bf16 = nullptr, *b_t_bf16 = nullptr;
};

struct LoraScratch {
  // The rank-wide rooms (LoraRankRooms) in the backend's memory, so on a device too: made at the
  // first use and regrown to the most tokens N, the rank and the widest adapted input and output
  // of any call, in MemCategory::other (titan plan's lora_scratch): rank (12 N + 8 out + 2 in)
  // bytes.
  Buffer rank_rooms;
  int64_t room_tokens = 0, room_rank = 0, room_in = 0, room_out = 0;
  // Under dropout, made at the first use and grown to the largest (N, in) of a call, in
  // MemCategory::other (titan plan's lora_scratch): the input masked (fp32), the backward's dx
  // share before its mask (fp32), and the masked input rounded (bf16), N in values each.
  Buffer dropout_rooms;
  LoraDropout dropout;
};

struct LoraLinear {
  std::string name;  // the adapted module, e.g. model.layers.0.self_attn.q_proj
  // Under tensor parallel the sizes of this rank's part (models/lora.h).
  int64_t rank = 0, in_features = 0, out_features = 0;
  float scaling = 0.0f;      // alpha / rank
  const float* a = nullptr;  // (rank, in)
  const float* b = nullptr;  // (out, rank)
  float* a_grad = nullptr;   // (rank, in) or null (not yet allocated)
  float* b_grad = nullptr;   // (out, rank) or null
  LoraScratch* scratch = nullptr;
  int64_t first_in_feature = 0;  // under TP a row-wise linear's first input column (dropout's key)

  // y (N, out) += (scaling * x A^T) B^T, x (N, in) in fp32, with the base linear's kernel (its
  // backward's dx product adds to y).
  void forward_add(float* y, const float* x, int64_t n, const LinearKernel& kernel) const;
  // Its backward for the output gradient dy (N, out): dx (N, in) += scaling * (dy B) A,
  // dB += scaling * dy^T (x A^T), dA += scaling * (dy B)^T x (x A^T made again from x).
  void backward(float* dx, const float* dy, const float* x, int64_t n,
                const LinearKernel& kernel) const;

  // The same with bf16 operands, as mixed precision computes every matmul (the kernel's bf16
  // forms: fp32 accumulation, fp32 outputs): x (N, in) arrives rounded, A and B are rounded at
  // each call, and u = scaling * x A^T is rounded before it multiplies B: y += round(u) B^T.
  void forward_add_bf16(float* y, const uint16_t* x, int64_t n, const LinearKernel& kernel) const;
  // dy (N, out) arrives rounded: du = scaling * dy B, dB += dy^T round(u); du is rounded before
  // its two products, dx += round(du) A and dA += round(du)^T x.
  void backward_bf16(float* dx, const uint16_t* dy, const uint16_t* x, int64_t n,
                     const LinearKernel& kernel) const;

 private:
  // The scratch's rank-wide rooms for a call over n tokens (regrown where this call needs more).
  LoraRankRooms rank_rooms(int64_t n) const;
  // A and B rounded into `rooms`; returns B^T rounded (rank, out) when `transposed`, else B.
  const uint16_t* round_weights(const LoraRankRooms& rooms, bool transposed) const;
  // Under dropout (scratch->dropout.on) the call's mask key, x (N, in) masked into the scratch and
  // dx += the masked dx share; without, x itself and dx += the share through the kernel.
  bool drops() const { return scratch->dropout.on; }
  LoraDropoutCall dropout_call() const;
  float* dropout_room(int64_t n, int64_t slot) const;  // slot 0 masked, 1 dx share
  uint16_t* dropout_room_bf16(int64_t n) const;
  const float* dropped(const float* x, int64_t n) const;
  const uint16_t* dropped_bf16(const uint16_t* x, int64_t n) const;
};

// LoRA on one sparse layer's stacked experts, as PEFT adapts Transformers 5's fused experts
// (ParamWrapper, ops/lora_experts.h): gate_proj and up_proj are one fused gate_up_proj there, so
// PEFT gives them one pair of rank 2r (A (E 2r, h), B (2 Im, 2r E): gate's rows of B, then up's)
// with alpha 2 alpha, the same scaling; down_proj one pair of rank r (A (E r, Im), B (h, r E)).
// PEFT folds the update into the weight (W + scaling B_e A_e, a parametrization, in fp32) and the
// experts compute with that (under torch.autocast, rounded to bf16); so do these: the merged
// weights are made into the scratch at each forward and again in the backward, whose weight
// gradient lands in the scratch (the frozen weights have none) and becomes A's and B's. The merged
// weights and their gradients are one layer's experts' size, shared by the layers.
struct ExpertLoraScratch {
  // Made at the first use, in MemCategory::other (titan plan's lora_scratch): the adapted ones of
  // the merged gate, up, down (E Im h each, in that order), then their gradients; and under
  // mixed precision the merged ones rounded to bf16.
  Buffer merged, rounded;
};

// One adapted stacked weight's A and B (rank 0: not adapted).
struct ExpertLoraPair {
  int64_t rank = 0;
  const float* a = nullptr;  // (E rank, in)
  const float* b = nullptr;  // (out, rank E)
  float* a_grad = nullptr;   // or null (not yet allocated)
  float* b_grad = nullptr;
};

struct ExpertLora {
  std::string name;                              // model.layers.{i}.mlp.experts
  int64_t n_experts = 0, hidden = 0, inter = 0;  // E, h, Im
  float scaling = 0.0f;                          // alpha / r, gate_up_proj's 2 alpha / 2r too
  ExpertLoraPair gate_up, down;
  ExpertLoraScratch* scratch = nullptr;

  // The weights the experts compute with: `base` with the adapted ones merged (into the scratch).
  ExpertWeights merged(const ExpertWeights& base) const;
  // Under mixed precision: the adapted ones of `merged` rounded to bf16 (into the scratch), as
  // torch.autocast rounds PEFT's merged fp32 weight for its GEMMs; the others `base`'s copies.
  ExpertWeightsBf16 rounded(const ExpertWeights& merged, const ExpertWeightsBf16& base) const;
  // Zeroed gradient rooms (in the scratch) of the adapted merged weights, null for the others.
  ExpertGrads merged_grads() const;
  // A's and B's gradients accumulated from `dmerged` (merged_grads' after the experts' backward),
  // with the weights' A and B.
  void backward(const ExpertGrads& dmerged) const;
  // How many of gate, up, down are adapted: the scratch holds that many merged weights (and
  // gradients, and bf16 roundings) of E Im h values.
  int64_t adapted_weights() const { return (gate_up.rank > 0 ? 2 : 0) + (down.rank > 0 ? 1 : 0); }

 private:
  float* merged_room(int64_t slot) const;  // slot in [0, 2 adapted_weights())
};

}  // namespace titan
