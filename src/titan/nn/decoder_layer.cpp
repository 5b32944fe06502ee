#include "titan/nn/decoder_layer.h"

#include "titan/dispatch/device_ops.h"

namespace titan {
namespace {

// out (N, h) and rstd (N) = norm(x) again, bit for bit as the forward made them, and out rounded
// to bf16 into out_bf16 when the linears read that rounding (the same rounding their forward
// made: linear_group_forward, SwigluMlp::forward).
void remake_norm(const RMSNorm& norm, float* out, float* rstd, uint16_t* out_bf16, const float* x,
                 int64_t n) {
  norm.forward(out, rstd, x, n);
  if (out_bf16 != nullptr) device_ops().round_to_bf16(out_bf16, out, n * norm.dim);
}

}  // namespace

void DecoderLayer::forward(float* out, LayerActivations& a, const float* x,
                           const LayerCall& call) const {
  const int64_t n = call.tokens(), h = input_layernorm.dim;
  const DeviceOps& ops = device_ops();
  input_layernorm.forward(a.norm1, a.norm1_rstd, x, n);
  self_attn.forward(a.resid_mid, a.attn, a.norm1, call);
  call.sum_partials(a.resid_mid, n * h);
  ops.add(a.resid_mid, x, n * h);  // x's last read: out may now overwrite it
  post_attention_layernorm.forward(a.norm2, a.norm2_rstd, a.resid_mid, n);
  if (sparse) {
    moe.forward(out, a.moe, *call.experts_scratch, a.norm2, n, call.collectives);
  } else {
    mlp.forward(out, a.mlp, a.norm2, n, call.linear);
  }
  call.sum_partials(out, n * h);
  ops.add(out, a.resid_mid, n * h);
}

void DecoderLayer::backward(float* d_resid, LayerGradScratch& g, const LayerActivations& a,
                            const float* x, const float* dprobs_all, const LayerCall& call) const {
  const int64_t n = call.tokens(), h = input_layernorm.dim;
  const DeviceOps& ops = device_ops();
  if (a.norms_remade) {
    remake_norm(post_attention_layernorm, a.norm2, a.norm2_rstd, sparse ? nullptr : a.mlp.x_bf16,
                a.resid_mid, n);
  }
  if (sparse) {
    moe.backward(g.d_norm, g.moe, d_resid, a.moe, a.norm2, dprobs_all, n, call.collectives);
  } else {
    mlp.backward(g.d_norm, g.mlp, d_resid, a.mlp, a.norm2, n, call.linear);
  }
  call.sum_partials(g.d_norm, n * h);
  post_attention_layernorm.backward(g.d_norm, g.d_norm, a.resid_mid, a.norm2_rstd, n);
  ops.add(d_resid, g.d_norm, n * h);
  if (a.norms_remade) remake_norm(input_layernorm, a.norm1, a.norm1_rstd, a.attn.x_bf16, x, n);
  self_attn.backward(g.d_norm, g.attn, d_resid, a.attn, a.norm1, call);
  call.sum_partials(g.d_norm, n * h);
  input_layernorm.backward(g.d_norm, g.d_norm, x, a.norm1_rstd, n);
  ops.add(d_resid, g.d_norm, n * h);
}

std::vector<Linear*> DecoderModules::matmul_linears() {
  std::vector<Linear*> linears;
  for (DecoderLayer& l : layers) {
    SelfAttention& s = l.self_attn;
    for (Linear* w : {&s.q_proj, &s.k_proj, &s.v_proj, &s.o_proj}) linears.push_back(w);
    if (!l.sparse) {
      for (Linear* w : {&l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) linears.push_back(w);
    }
  }
  linears.push_back(&lm_head);
  return linears;
}

std::vector<const Linear*> DecoderModules::matmul_linears() const {
  const std::vector<Linear*> linears = const_cast<DecoderModules*>(this)->matmul_linears();
  return {linears.begin(), linears.end()};
}

}  // namespace titan
