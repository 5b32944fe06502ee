// The decoder layer of the Llama family -- Llama, Qwen2, Qwen3 and Qwen3-MoE differ only in what
// its blocks contain (biases, q/k norm, a dense or sparse MLP) -- written once for training,
// evaluation and KV-cached decode:
//   x -> input_layernorm -> self_attn -> + x -> post_attention_layernorm -> mlp -> + (x + attn)
// and the module tree of a whole decoder-only model built from such layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/nn/layers.h"

namespace titan {

// What one layer's forward keeps for its backward (N = batch * seq tokens; R = the residual
// stream's rows on this rank, LayerCall::rows(): N, or N / tp under sequence parallel, whose
// blocks see their inputs gathered whole). Decode points every layer at the same scratch, since
// nothing is kept.
struct LayerActivations {
  float* norm1 = nullptr;       // (R, h)
  float* norm1_rstd = nullptr;  // (R)
  AttentionActivations attn;
  float* resid_mid = nullptr;   // (R, h) x + attention
  float* norm2 = nullptr;       // (R, h)
  float* norm2_rstd = nullptr;  // (R)
  MlpActivations mlp;           // dense layers
  MoeActivations moe;           // sparse layers
  // bf16 training under sequence parallel: norm1 and norm2 rounded to bf16 (R, h), kept for the
  // backward, which widens and gathers them again into the blocks' whole rounding (attn.x_bf16,
  // mlp.x_bf16: then scratch every layer shares); null otherwise (norm1 and norm2 are then
  // scratch).
  uint16_t* norm1_bf16 = nullptr;
  uint16_t* norm2_bf16 = nullptr;
  // Selective activation checkpointing "op": norm1 and norm2 (and attn.x_bf16, mlp.x_bf16) are
  // scratch every layer shares, made again by the backward from x and resid_mid, as the forward
  // made them (the rstds rewritten with the same values).
  bool norms_remade = false;
};

// Backward scratch one layer uses while it runs, shared by all layers.
struct LayerGradScratch {
  float* d_norm = nullptr;  // (N, h) a block input's gradient (partial sums under TP)
  AttentionGradScratch attn;
  MlpGradScratch mlp;
  MoeGradScratch moe;
};

struct DecoderLayer {
  std::string name;  // model.layers.{i}
  RMSNorm input_layernorm;
  SelfAttention self_attn;
  RMSNorm post_attention_layernorm;
  bool sparse = false;  // the MLP is `moe`, else `mlp`
  SwigluMlp mlp;
  SparseMoeBlock moe;

  // out (R, h) = the layer of x (R, h), which out may alias (decode updates one residual stream
  // in place). What the backward needs is kept in `a`.
  void forward(float* out, LayerActivations& a, const float* x, const LayerCall& call) const;
  // d_resid (R, h) holds d loss / d out on entry and d loss / d x on return; parameter gradients
  // accumulate. dprobs_all (E), optional: the load-balancing loss's gradient on every row's router
  // probabilities (sparse layers).
  void backward(float* d_resid, LayerGradScratch& g, const LayerActivations& a, const float* x,
                const float* dprobs_all, const LayerCall& call) const;

 private:
  // This rank's rows (R, h) of `norm` of norm_in in `normed` for a backward: made again (remade),
  // widened from its kept rounding, or as kept.
  float* backward_norm_rows(const RMSNorm& norm, float* normed, float* rstd,
                            const uint16_t* kept_bf16, const float* norm_in, bool remade,
                            const LayerCall& call) const;
  // A block's input (N, h) for its backward: `norm` of norm_in (R rows) in `normed` made again
  // (remade), widened from its kept rounding, or as kept; gathered under sequence parallel; and
  // rounded into whole_bf16 when the block reads it so and nothing kept that rounding whole.
  const float* backward_block_input(const RMSNorm& norm, float* normed, float* rstd,
                                    const uint16_t* kept_bf16, uint16_t* whole_bf16,
                                    const float* norm_in, bool remade, const LayerCall& call) const;
};

// The module tree of a decoder-only causal LM: what a forward of any kind walks.
struct DecoderModules {
  Embedding embed_tokens;
  std::vector<DecoderLayer> layers;
  RMSNorm norm;
  Linear lm_head;  // (V, h); its weight is embed_tokens' when tied

  // The linears whose weights a bf16 copy serves: every layer's attention projections and dense
  // MLP projections (not the MoE router, which stays fp32), then the lm_head.
  std::vector<Linear*> matmul_linears();

  // fn(pointer, gradient) for every pointer the modules hold into parameter-group buffers --
  // `float*&` or `const float*&`, null ones included (a linear without a bias): the parameters'
  // and their gradients'. What a model rebinds when a unit's memory moves.
  template <typename Fn>
  void for_each_group_pointer(Fn&& fn) {
    const auto linear = [&](Linear& l) {
      fn(l.weight, false);
      fn(l.bias, false);
      fn(l.weight_grad, true);
      fn(l.bias_grad, true);
    };
    const auto rms_norm = [&](RMSNorm& n) {
      fn(n.weight, false);
      fn(n.weight_grad, true);
    };
    fn(embed_tokens.weight, false);
    fn(embed_tokens.weight_grad, true);
    for (DecoderLayer& l : layers) {
      rms_norm(l.input_layernorm);
      for (Linear* p :
           {&l.self_attn.q_proj, &l.self_attn.k_proj, &l.self_attn.v_proj, &l.self_attn.o_proj}) {
        linear(*p);
      }
      if (l.self_attn.qk_norm) {
        rms_norm(l.self_attn.q_norm);
        rms_norm(l.self_attn.k_norm);
      }
      rms_norm(l.post_attention_layernorm);
      if (l.sparse) {
        linear(l.moe.gate);
        for (const float** w : {&l.moe.weights.gate, &l.moe.weights.up, &l.moe.weights.down}) {
          fn(*w, false);
        }
        for (float** g : {&l.moe.grads.gate, &l.moe.grads.up, &l.moe.grads.down}) fn(*g, true);
      } else {
        for (Linear* p : {&l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) linear(*p);
      }
    }
    rms_norm(norm);
    linear(lm_head);
  }
};

}  // namespace titan
