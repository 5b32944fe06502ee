#include "titan/nn/decoder_layer.h"

#include "titan/dispatch/device_ops.h"

namespace titan {

void DecoderLayer::forward(float* out, LayerActivations& a, const float* x,
                           const LayerCall& call) const {
  const int64_t n = call.tokens(), rows = call.rows(), h = input_layernorm.dim;
  const DeviceOps& ops = device_ops();
  input_layernorm.forward(a.norm1, a.norm1_rstd, x, rows);
  if (a.norm1_bf16 != nullptr) ops.round_to_bf16(a.norm1_bf16, a.norm1, rows * h);
  float* attn_out = call.block_output(a.resid_mid);
  self_attn.forward(attn_out, a.attn, call.gather_block_input(a.norm1, h), call);
  call.sum_block_output(a.resid_mid, attn_out, h);
  ops.add(a.resid_mid, x, rows * h);  // x's last read: out may now overwrite it
  post_attention_layernorm.forward(a.norm2, a.norm2_rstd, a.resid_mid, rows);
  if (a.norm2_bf16 != nullptr) ops.round_to_bf16(a.norm2_bf16, a.norm2, rows * h);
  // A sparse block with whole experts under TP (EP x TP) runs on this rank's tokens; one whose
  // experts are cut over TP (SparseMoeBlock::tp_cut) is a TP block like the dense MLP (below).
  const bool on_shard = sparse && !moe.tp_cut;
  if (on_shard && call.sequence_shards != nullptr) {
    // Sequence parallel: the sparse block on this rank's tokens, as torchtitan runs it -- the
    // router (replicated) on the rank's rows, the rows to their experts over the EP group (which
    // holds the TP ranks), the output this rank's rows: nothing gathered, nothing summed.
    moe.forward(out, a.moe, *call.experts_scratch, a.norm2, rows, call.collectives);
  } else if (on_shard && call.sparse_shard != nullptr) {
    // EP x TP without sequence parallel: the same on this rank's shard of the whole, replicated
    // input, the output rows all-gathered whole (torchtitan slices and gathers the same way).
    const SparseBlockShard& s = *call.sparse_shard;
    call.slice_sparse_rows(a.norm2, s.x, h);
    moe.forward(s.y, a.moe, *call.experts_scratch, s.x, n / s.degree, call.collectives);
    call.gather_sparse_rows(s.y, out, h);
  } else {
    const float* mlp_in = call.gather_block_input(a.norm2, h);
    float* mlp_out = call.block_output(out);
    if (sparse) {
      moe.forward(mlp_out, a.moe, *call.experts_scratch, mlp_in, n, call.collectives);
    } else {
      mlp.forward(mlp_out, a.mlp, mlp_in, n, call.linear);
    }
    call.sum_block_output(out, mlp_out, h);
  }
  ops.add(out, a.resid_mid, rows * h);
}

float* DecoderLayer::backward_norm_rows(const RMSNorm& norm, float* normed, float* rstd,
                                        const uint16_t* kept_bf16, const float* norm_in,
                                        bool remade, const LayerCall& call) const {
  // Made again bit for bit as the forward made them (the rstd rewritten with the same values);
  // a kept rounding widens exactly, so rounding it again gives the forward's bits.
  if (remade) {
    norm.forward(normed, rstd, norm_in, call.rows());
  } else if (kept_bf16 != nullptr) {
    device_ops().widen_bf16(normed, kept_bf16, call.rows() * norm.dim);
  }
  return normed;
}

const float* DecoderLayer::backward_block_input(const RMSNorm& norm, float* normed, float* rstd,
                                                const uint16_t* kept_bf16, uint16_t* whole_bf16,
                                                const float* norm_in, bool remade,
                                                const LayerCall& call) const {
  const int64_t h = norm.dim;
  const float* whole = call.gather_block_input(
      backward_norm_rows(norm, normed, rstd, kept_bf16, norm_in, remade, call), h);
  if (whole_bf16 != nullptr && (remade || call.sequence_shards != nullptr)) {
    device_ops().round_to_bf16(whole_bf16, whole, call.tokens() * h);
  }
  return whole;
}

void DecoderLayer::backward(float* d_resid, LayerGradScratch& g, const LayerActivations& a,
                            const float* x, const float* dprobs_all, const LayerCall& call) const {
  const int64_t n = call.tokens(), rows = call.rows(), h = input_layernorm.dim;
  const DeviceOps& ops = device_ops();
  float* d_rows = call.input_grad_rows(g.d_norm);
  const bool on_shard = sparse && !moe.tp_cut;  // as in the forward
  if (on_shard && call.sequence_shards != nullptr) {
    // The sparse block ran on this rank's tokens (forward): its input and gradients are rows.
    const float* moe_in = backward_norm_rows(post_attention_layernorm, a.norm2, a.norm2_rstd,
                                             nullptr, a.resid_mid, a.norms_remade, call);
    moe.backward(d_rows, g.moe, d_resid, a.moe, moe_in, dprobs_all, rows, call.collectives);
  } else if (on_shard && call.sparse_shard != nullptr) {
    // The output's gradient is whole and the same on every TP rank: this rank's rows of it; the
    // input gradient's rows gathered whole, as the replicated input's backward needs.
    const SparseBlockShard& s = *call.sparse_shard;
    call.slice_sparse_rows(backward_norm_rows(post_attention_layernorm, a.norm2, a.norm2_rstd,
                                              nullptr, a.resid_mid, a.norms_remade, call),
                           s.x, h);
    call.slice_sparse_rows(d_resid, s.y, h);
    moe.backward(s.dx, g.moe, s.y, a.moe, s.x, dprobs_all, n / s.degree, call.collectives);
    call.gather_sparse_rows(s.dx, d_rows, h);
  } else {
    const float* mlp_in =
        backward_block_input(post_attention_layernorm, a.norm2, a.norm2_rstd, a.norm2_bf16,
                             sparse ? nullptr : a.mlp.x_bf16, a.resid_mid, a.norms_remade, call);
    const float* d_mlp_out = call.gather_output_grad(d_resid, h);
    if (sparse) {
      moe.backward(g.d_norm, g.moe, d_mlp_out, a.moe, mlp_in, dprobs_all, n, call.collectives);
    } else {
      mlp.backward(g.d_norm, g.mlp, d_mlp_out, a.mlp, mlp_in, n, call.linear);
    }
    call.sum_block_output(d_rows, g.d_norm, h);
  }
  post_attention_layernorm.backward(d_rows, d_rows, a.resid_mid, a.norm2_rstd, rows);
  ops.add(d_resid, d_rows, rows * h);
  const float* attn_in = backward_block_input(input_layernorm, a.norm1, a.norm1_rstd, a.norm1_bf16,
                                              a.attn.x_bf16, x, a.norms_remade, call);
  self_attn.backward(g.d_norm, g.attn, call.gather_output_grad(d_resid, h), a.attn, attn_in, call);
  call.sum_block_output(d_rows, g.d_norm, h);
  input_layernorm.backward(d_rows, d_rows, x, a.norm1_rstd, rows);
  ops.add(d_resid, d_rows, rows * h);
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

}  // namespace titan
