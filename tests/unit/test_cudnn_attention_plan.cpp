// The host side of cuDNN's fused attention (ops/cuda/attention_cudnn_plan.h), which needs neither
// cuDNN nor a GPU: the shapes the kernel takes, the keys its graphs are cached under, and its
// workspace's layout. The kernel itself runs in titan_cuda_kernels_test, on a GPU.
#include <gtest/gtest.h>

#include <set>

#include "titan/ops/cuda/attention_cudnn_plan.h"

namespace titan {
namespace {

using cudnn_attention::GraphKey;
using cudnn_attention::Pass;

// Qwen3-0.6B's training shape: 8 x 2048 tokens, 16 / 8 heads x 128.
AttentionShape qwen3_shape() {
  AttentionShape s;
  s.batch = 8;
  s.seq_q = s.seq_kv = 2048;
  s.n_heads = 16;
  s.n_kv_heads = 8;
  s.head_dim = 128;
  return s;
}

TEST(CudnnAttentionPlan, CheckTakesSquareCausalHeadDims64To256) {
  AttentionShape s = qwen3_shape();
  EXPECT_EQ(cudnn_attention::check(s), "");
  for (const int64_t hd : {64, 72, 128, 200, 256}) {
    s.head_dim = hd;
    EXPECT_EQ(cudnn_attention::check(s), "") << hd;
  }
  for (const int64_t hd : {8, 32, 56, 100, 264, 512}) {
    s.head_dim = hd;
    EXPECT_EQ(cudnn_attention::check(s),
              "head_dim a multiple of 8 from 64 to 256 (cuDNN's fused attention), not " +
                  std::to_string(hd));
  }
  s = qwen3_shape();
  s.seq_q = 1;  // a decode step against a cache
  EXPECT_EQ(cudnn_attention::check(s), "seq_q == seq_kv (training's causal mask; no KV cache)");
  // GQA ratios 1, 2 and 8 are all taken.
  for (const int64_t kv : {16, 8, 2}) {
    s = qwen3_shape();
    s.n_kv_heads = kv;
    EXPECT_EQ(cudnn_attention::check(s), "") << kv;
  }
}

TEST(CudnnAttentionPlan, GraphKeysTellApartEverythingAGraphBakesIn) {
  const AttentionShape base = qwen3_shape();
  std::set<GraphKey> keys;
  keys.insert(cudnn_attention::graph_key(Pass::forward, DType::bf16, base));
  // The same shape again finds the same graph; packed-row starts are not part of a graph.
  AttentionShape same = base;
  const int32_t starts[1] = {0};
  same.segment_start = starts;
  EXPECT_FALSE(keys.insert(cudnn_attention::graph_key(Pass::forward, DType::bf16, same)).second);
  // Each of pass, dtype, batch, sequence, heads, kv heads and head dim makes another graph.
  EXPECT_TRUE(keys.insert(cudnn_attention::graph_key(Pass::backward, DType::bf16, base)).second);
  EXPECT_TRUE(keys.insert(cudnn_attention::graph_key(Pass::forward, DType::f16, base)).second);
  const auto changed = [&](auto change) {
    AttentionShape s = base;
    change(s);
    return keys.insert(cudnn_attention::graph_key(Pass::forward, DType::bf16, s)).second;
  };
  EXPECT_TRUE(changed([](AttentionShape& s) { s.batch = 4; }));
  EXPECT_TRUE(changed([](AttentionShape& s) { s.seq_q = s.seq_kv = 1024; }));
  EXPECT_TRUE(changed([](AttentionShape& s) { s.n_heads = 32; }));
  EXPECT_TRUE(changed([](AttentionShape& s) { s.n_kv_heads = 2; }));
  EXPECT_TRUE(changed([](AttentionShape& s) { s.head_dim = 64; }));
  EXPECT_EQ(keys.size(), 8u);
}

TEST(CudnnAttentionPlan, WorkspaceHoldsTheBf16StagingThenCudnns) {
  const AttentionShape s = qwen3_shape();
  const int64_t q_bytes = 8 * 2048 * 16 * 128 * 2;  // 64 MiB
  const int64_t kv_bytes = q_bytes / 2;
  const cudnn_attention::Staging fwd = cudnn_attention::staging(Pass::forward, s);
  EXPECT_EQ(fwd.o, 0);
  EXPECT_EQ(fwd.cudnn, q_bytes);
  EXPECT_EQ(fwd.dout, -1);
  const cudnn_attention::Staging bwd = cudnn_attention::staging(Pass::backward, s);
  EXPECT_EQ(bwd.o, -1);
  EXPECT_EQ(bwd.dout, 0);
  EXPECT_EQ(bwd.dq, q_bytes);
  EXPECT_EQ(bwd.dk, 2 * q_bytes);
  EXPECT_EQ(bwd.dv, 2 * q_bytes + kv_bytes);
  EXPECT_EQ(bwd.cudnn, 2 * q_bytes + 2 * kv_bytes);
  EXPECT_EQ(cudnn_attention::workspace_bytes(Pass::backward, s, 0), 192 << 20);
  // cuDNN's own bytes follow, rounded up to the 256-byte alignment.
  EXPECT_EQ(cudnn_attention::workspace_bytes(Pass::forward, s, 1), q_bytes + 256);
  EXPECT_EQ(cudnn_attention::workspace_bytes(Pass::forward, s, 256), q_bytes + 256);
  EXPECT_EQ(cudnn_attention::workspace_bytes(Pass::forward, s, 257), q_bytes + 512);
}

TEST(CudnnAttentionPlan, OddSizesStartEveryArrayOn256Bytes) {
  AttentionShape s;
  s.batch = 1;
  s.seq_q = s.seq_kv = 131;
  s.n_heads = 8;
  s.n_kv_heads = 1;
  s.head_dim = 72;
  const int64_t q_bytes = 131 * 8 * 72 * 2;  // 150912 = 589.5 x 256
  const int64_t kv_bytes = 131 * 72 * 2;     // 18864 = 73.7 x 256
  const cudnn_attention::Staging st = cudnn_attention::staging(Pass::backward, s);
  for (const int64_t offset : {st.dout, st.dq, st.dk, st.dv, st.cudnn}) {
    EXPECT_EQ(offset % 256, 0) << offset;
  }
  EXPECT_GE(st.dq - st.dout, q_bytes);
  EXPECT_GE(st.dk - st.dq, q_bytes);
  EXPECT_GE(st.dv - st.dk, kv_bytes);
  EXPECT_GE(st.cudnn - st.dv, kv_bytes);
  EXPECT_LT(st.cudnn - st.dv, kv_bytes + 256);
}

}  // namespace
}  // namespace titan
