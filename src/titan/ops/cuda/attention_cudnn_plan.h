// The host side of cuDNN's fused attention (attention_cudnn.cpp), with no cuDNN or CUDA in it so
// tests/unit/test_cudnn_attention_plan.cpp checks it without a GPU: the shapes the kernel takes,
// the key its graphs are cached under, and how its one workspace is carved.
//
// cuDNN's SDPA reads and writes half types only; titan's bf16 attention interface
// (ops/attention.h) takes bf16 q, k, v and out but fp32 out (forward), dout, dq, dk and dv. Those
// go through bf16 staging arrays in the workspace: the forward's O is widened into out (exact; the
// caller rounds out to bf16 for o_proj anyway), the backward's dout is rounded for cuDNN, and its
// bf16 dQ, dK, dV are widened (PyTorch's SDPA under autocast returns bf16 gradients too).
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "titan/core/dtype.h"
#include "titan/ops/attention.h"

namespace titan::cudnn_attention {

enum class Pass { forward, backward };

// What one built cuDNN graph runs: cuDNN bakes the dims, strides and io dtype into a graph, so
// each (pass, io dtype, shape) gets its own, built on its first call and kept for the process.
struct GraphKey {
  Pass pass = Pass::forward;
  DType io = DType::bf16;
  int64_t batch = 0;
  int64_t seq = 0;  // seq_q == seq_kv (check)
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  auto operator<=>(const GraphKey&) const = default;
};

inline GraphKey graph_key(Pass pass, DType io, const AttentionShape& s) {
  return {pass, io, s.batch, s.seq_q, s.n_heads, s.n_kv_heads, s.head_dim};
}

// Empty when the kernel runs `s` (a consistent shape, attention_check_shape), else what it
// requires: training's square causal mask (cuDNN's top-left diagonal is titan's only when
// Sq == Skv), head_dim a multiple of 8 (cuDNN's 16-byte rows) from 64 to 256 (what cuDNN 9's
// Hopper kernels take, and what the kernels test covers).
inline std::string check(const AttentionShape& s) {
  if (s.seq_q != s.seq_kv) return "seq_q == seq_kv (training's causal mask; no KV cache)";
  if (s.head_dim < 64 || s.head_dim > 256 || s.head_dim % 8 != 0) {
    return "head_dim a multiple of 8 from 64 to 256 (cuDNN's fused attention), not " +
           std::to_string(s.head_dim);
  }
  return {};
}

// Offsets in bytes into the workspace; each array starts on a 256-byte boundary (cuDNN reads its
// operands with 16-byte vector loads and TMA, and the workspace itself comes from cudaMalloc).
// The forward stages O; the backward dO, dQ, dK and dV; cuDNN's own workspace follows them.
struct Staging {
  int64_t o = -1;
  int64_t dout = -1;
  int64_t dq = -1;
  int64_t dk = -1;
  int64_t dv = -1;
  int64_t cudnn = 0;  // where cuDNN's workspace starts: the staging's bytes
};

constexpr int64_t kAlignment = 256;

inline int64_t aligned(int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

inline Staging staging(Pass pass, const AttentionShape& s) {
  const int64_t q_bytes = aligned(s.batch * s.seq_q * s.n_heads * s.head_dim * 2);
  const int64_t kv_bytes = aligned(s.batch * s.seq_kv * s.n_kv_heads * s.head_dim * 2);
  Staging st;
  if (pass == Pass::forward) {
    st.o = 0;
    st.cudnn = q_bytes;
    return st;
  }
  st.dout = 0;
  st.dq = q_bytes;
  st.dk = 2 * q_bytes;
  st.dv = 2 * q_bytes + kv_bytes;
  st.cudnn = 2 * q_bytes + 2 * kv_bytes;
  return st;
}

// The workspace a graph needs: its staging, then the `cudnn_bytes` cuDNN reported for its plan.
inline int64_t workspace_bytes(Pass pass, const AttentionShape& s, int64_t cudnn_bytes) {
  return staging(pass, s).cudnn + aligned(cudnn_bytes);
}

}  // namespace titan::cudnn_attention
