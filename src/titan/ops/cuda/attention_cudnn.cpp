// Causal GQA attention through cuDNN's fused SDPA (flash attention on tensor cores), built with
// NVIDIA's header-only cudnn-frontend: mixed-precision training's bf16 forward (the softmax's
// log-sum-exp saved as its statistics) and backward, fp32 accumulation inside cuDNN. Host code
// only: cuDNN launches its own kernels on the default stream, where the backend's run too.
//
// One graph per (pass, io dtype, shape), built on its first call and kept for the process
// (attention_cudnn_plan.h: the key, the shapes taken, the staging; attention_cudnn_graphs.h: what
// each graph computes); one workspace from the backend's memory, grown only when a new graph needs
// more, so a step allocates nothing.
// Not yet run on a GPU (docs/ARCHITECTURE.md, ops/cuda).
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "titan/backend/backend.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/ops/cuda/attention_cudnn_graphs.h"
#include "titan/ops/cuda/attention_cudnn_plan.h"
#include "titan/ops/cuda/cuda_ops.h"

namespace titan::cuda_ops {
namespace {

namespace fe = cudnn_frontend;
using cudnn_attention::GraphKey;
using cudnn_attention::Pass;
using cudnn_attention::Staging;
using namespace cudnn_attention::uid;

std::string describe(const GraphKey& key) {
  return std::string(key.pass == Pass::forward ? "forward" : "backward") + " of batch " +
         std::to_string(key.batch) + " x seq " + std::to_string(key.seq) + ", " +
         std::to_string(key.n_heads) + "/" + std::to_string(key.n_kv_heads) + " heads x " +
         std::to_string(key.head_dim);
}

void check_fe(fe::error_t status, const char* step, const GraphKey& key) {
  TITAN_CHECK(status.is_good(), "cuDNN attention ", describe(key), ": ", step,
              " failed: ", status.get_message());
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  TITAN_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN: ", what,
              " failed: ", cudnnGetErrorString(status));
}

// The graphs built so far and the one workspace they share (calls run one at a time on the
// stream). Never destroyed: its handle and device buffer would be released after the CUDA
// runtime's own teardown at exit.
class GraphCache {
 public:
  struct Run {
    const fe::graph::Graph* graph;
    char* workspace;
    cudnnHandle_t handle;
  };

  Run get(Pass pass, const AttentionShape& s) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (handle_ == nullptr) check_cudnn(cudnnCreate(&handle_), "cudnnCreate");
    const GraphKey key = cudnn_attention::graph_key(pass, DType::bf16, s);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, build(key)).first;
    const auto bytes =
        static_cast<size_t>(cudnn_attention::workspace_bytes(pass, s, it->second.cudnn_bytes));
    if (workspace_.bytes() < bytes) {
      workspace_ = Buffer();  // the old one freed first: the peak is the new one alone
      workspace_ = Buffer(backend().memory(), bytes, MemCategory::activations);
    }
    return {it->second.graph.get(), static_cast<char*>(workspace_.data()), handle_};
  }

 private:
  struct Built {
    std::unique_ptr<fe::graph::Graph> graph;
    int64_t cudnn_bytes = 0;
  };

  Built build(const GraphKey& key) {
    Built b{cudnn_attention::describe_graph(key)};
    check_fe(b.graph->validate(), "validate", key);
    check_fe(b.graph->build_operation_graph(handle_), "build_operation_graph", key);
    check_fe(b.graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", key);
    check_fe(b.graph->check_support(), "check_support", key);
    check_fe(b.graph->build_plans(), "build_plans", key);
    check_fe(b.graph->get_workspace_size(b.cudnn_bytes), "get_workspace_size", key);
    return b;
  }

  std::mutex mutex_;
  cudnnHandle_t handle_ = nullptr;
  std::map<GraphKey, Built> graphs_;
  Buffer workspace_;
};

GraphCache& cache() {
  static auto* c = new GraphCache;
  return *c;
}

void require_runs(const AttentionShape& s) {
  TITAN_CHECK(s.segment_start == nullptr,
              "cuDNN attention requires one sequence per row (it does not take packed rows)");
  attention_check_shape(s);
  const std::string refused = attention_cudnn_check(s);
  TITAN_CHECK(refused.empty(), "cuDNN attention requires ", refused);
}

void* bits(const uint16_t* p) {
  return const_cast<uint16_t*>(p);  // cuDNN's variant pack takes void* for inputs too
}

void execute(const GraphCache::Run& run, std::unordered_map<int64_t, void*>& pack,
             const Staging& st, Pass pass, const AttentionShape& s) {
  check_fe(run.graph->execute(run.handle, pack, run.workspace + st.cudnn), "execute",
           cudnn_attention::graph_key(pass, DType::bf16, s));
}

// A query block over a longer KV cache (generation's decode steps and chunked prefill) is not
// training's square causal mask, which the cached graphs are built for: the forward runs the simple
// kernel's bf16 form there (one query row is bound by reading the cache, not by its arithmetic),
// and the shape is held to that kernel's requirements. Training never makes such a call.
bool is_kv_cache_step(const AttentionShape& s) {
  return s.seq_q != s.seq_kv;
}

}  // namespace

std::string attention_cudnn_check(const AttentionShape& s) {
  if (is_kv_cache_step(s)) return attention_check(s);
  const std::string refused = cudnn_attention::check(s);
  return refused.empty() ? attention_check(s) : refused;
}

void attention_forward_cudnn_bf16(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, const AttentionShape& s) {
  if (is_kv_cache_step(s)) return attention_forward_bf16(out, lse, q, k, v, s);
  require_runs(s);
  const GraphCache::Run run = cache().get(Pass::forward, s);
  const Staging st = cudnn_attention::staging(Pass::forward, s);
  auto* o = reinterpret_cast<uint16_t*>(run.workspace + st.o);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, bits(q)}, {kK, bits(k)}, {kV, bits(v)}, {kO, o}, {kStats, lse}};
  execute(run, pack, st, Pass::forward, s);
  widen_bf16(out, o, s.batch * s.seq_q * s.n_heads * s.head_dim);
}

void attention_backward_cudnn_bf16(float* dq, float* dk, float* dv, const float* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse, const AttentionShape& s) {
  require_runs(s);
  const GraphCache::Run run = cache().get(Pass::backward, s);
  const Staging st = cudnn_attention::staging(Pass::backward, s);
  const auto staged = [&](int64_t offset) {
    return reinterpret_cast<uint16_t*>(run.workspace + offset);
  };
  const int64_t q_count = s.batch * s.seq_q * s.n_heads * s.head_dim;
  const int64_t kv_count = s.batch * s.seq_kv * s.n_kv_heads * s.head_dim;
  round_to_bf16(staged(st.dout), dout, q_count);
  std::unordered_map<int64_t, void*> pack = {{kQ, bits(q)},
                                             {kK, bits(k)},
                                             {kV, bits(v)},
                                             {kO, bits(out)},
                                             {kDout, staged(st.dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDq, staged(st.dq)},
                                             {kDk, staged(st.dk)},
                                             {kDv, staged(st.dv)}};
  execute(run, pack, st, Pass::backward, s);
  widen_bf16(dq, staged(st.dq), q_count);
  widen_bf16(dk, staged(st.dk), kv_count);
  widen_bf16(dv, staged(st.dv), kv_count);
}

}  // namespace titan::cuda_ops
