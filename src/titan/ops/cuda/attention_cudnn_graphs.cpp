// The descriptions of attention_cudnn_graphs.h.
#include "titan/ops/cuda/attention_cudnn_graphs.h"

#include <cmath>
#include <vector>

namespace titan::cudnn_attention {
namespace {

namespace fe = cudnn_frontend;
using namespace uid;

// titan's (B, S, heads, D) rows as cuDNN's (B, heads, S, D) dims.
std::vector<int64_t> row_dims(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
  return {batch, heads, seq, head_dim};
}
std::vector<int64_t> row_strides(int64_t heads, int64_t seq, int64_t head_dim) {
  return {seq * heads * head_dim, head_dim, heads * head_dim, 1};
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr input_rows(fe::graph::Graph& g, const char* name, int64_t uid, int64_t batch,
                     int64_t heads, int64_t seq, int64_t head_dim) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(row_dims(batch, heads, seq, head_dim))
                      .set_stride(row_strides(heads, seq, head_dim)));
}

void output_rows(const TensorPtr& t, int64_t uid, int64_t batch, int64_t heads, int64_t seq,
                 int64_t head_dim) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim(row_dims(batch, heads, seq, head_dim))
      .set_stride(row_strides(heads, seq, head_dim));
}

// The softmax statistics: titan's lse, (B, H, Sq) fp32, the natural log of each query's sum of
// exp(scaled score) -- what cuDNN's Stats hold (stats_use_log2 off).
std::vector<int64_t> stats_dims(const GraphKey& k) {
  return {k.batch, k.n_heads, k.seq, 1};
}
std::vector<int64_t> stats_strides(const GraphKey& k) {
  return {k.n_heads * k.seq, k.seq, 1, 1};
}

// The square causal mask (key j visible to query i when j <= i) and softmax(q k^T / sqrt(hd)),
// the scale computed as ops/attention's kernels compute it.
float attention_scale(int64_t head_dim) {
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::unique_ptr<fe::graph::Graph> new_graph(int32_t sm_version) {
  auto g = std::make_unique<fe::graph::Graph>();
  // Before any node: each node takes the graph's settings when it is added.
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::unique_ptr<fe::graph::Graph> forward_graph(const GraphKey& k, int32_t sm_version) {
  auto g = new_graph(sm_version);
  const auto q = input_rows(*g, "q", kQ, k.batch, k.n_heads, k.seq, k.head_dim);
  const auto kk = input_rows(*g, "k", kK, k.batch, k.n_kv_heads, k.seq, k.head_dim);
  const auto v = input_rows(*g, "v", kV, k.batch, k.n_kv_heads, k.seq, k.head_dim);
  const auto options = fe::graph::SDPA_attributes()
                           .set_name("attention_forward")
                           .set_generate_stats(true)
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0)
                           .set_attn_scale(attention_scale(k.head_dim));
  const auto [o, stats] = g->sdpa(q, kk, v, options);
  output_rows(o, kO, k.batch, k.n_heads, k.seq, k.head_dim);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(k))
      .set_stride(stats_strides(k));
  return g;
}

std::unique_ptr<fe::graph::Graph> backward_graph(const GraphKey& k, int32_t sm_version) {
  auto g = new_graph(sm_version);
  const auto q = input_rows(*g, "q", kQ, k.batch, k.n_heads, k.seq, k.head_dim);
  const auto kk = input_rows(*g, "k", kK, k.batch, k.n_kv_heads, k.seq, k.head_dim);
  const auto v = input_rows(*g, "v", kV, k.batch, k.n_kv_heads, k.seq, k.head_dim);
  const auto o = input_rows(*g, "o", kO, k.batch, k.n_heads, k.seq, k.head_dim);
  const auto dout = input_rows(*g, "dout", kDout, k.batch, k.n_heads, k.seq, k.head_dim);
  const auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(kStats)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_dim(stats_dims(k))
                                   .set_stride(stats_strides(k)));
  const auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0)
                           .set_attn_scale(attention_scale(k.head_dim));
  const auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, options);
  output_rows(dq, kDq, k.batch, k.n_heads, k.seq, k.head_dim);
  output_rows(dk, kDk, k.batch, k.n_kv_heads, k.seq, k.head_dim);
  output_rows(dv, kDv, k.batch, k.n_kv_heads, k.seq, k.head_dim);
  return g;
}

}  // namespace

std::unique_ptr<fe::graph::Graph> describe_graph(const GraphKey& key, int32_t sm_version) {
  return key.pass == Pass::forward ? forward_graph(key, sm_version)
                                   : backward_graph(key, sm_version);
}

}  // namespace titan::cudnn_attention
