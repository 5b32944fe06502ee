// Host-side, no GPU needed: every cuDNN attention graph titan describes (attention_cudnn_graphs.h)
// passes cudnn-frontend's validation for Hopper (SM 90: its SDPA support checks -- dims, strides
// and alignment, GQA, the causal mask, head dims -- and the graph's consistency), forward and
// backward, on the shapes titan_cuda_kernels_test runs and on Qwen3-0.6B's training shape. What
// it cannot check without a GPU is cuDNN's own plan for the graph (an engine that runs it), which
// the kernels test reaches. Shown able to fail: a head_dim cuDNN refuses (not a multiple of 8),
// whose forward and backward must both be refused. Prints a line per graph; exit 1 otherwise.
#include <cstdio>
#include <string>
#include <vector>

#include "titan/ops/cuda/attention_cudnn_graphs.h"

namespace {

using namespace titan;
using cudnn_attention::GraphKey;
using cudnn_attention::Pass;

// Empty when the frontend validates `key`'s graph for SM 90, else its message.
std::string refusal(const GraphKey& key) {
  const auto graph = cudnn_attention::describe_graph(key, 90);
  auto status = graph->validate();
  return status.is_good() ? std::string() : status.get_message();
}

std::string name(const GraphKey& k) {
  return std::string(k.pass == Pass::forward ? "forward " : "backward") + " B " +
         std::to_string(k.batch) + " S " + std::to_string(k.seq) + " H/KV " +
         std::to_string(k.n_heads) + "/" + std::to_string(k.n_kv_heads) + " hd " +
         std::to_string(k.head_dim);
}

}  // namespace

int main() {
  struct Size {
    int64_t batch, seq, heads, kv_heads, head_dim;
  };
  // titan_cuda_kernels_test's square cases (GQA 1, 8, 2 on odd lengths), Qwen3-0.6B at
  // 8 x 2048, and the head dims' ends.
  const std::vector<Size> sizes = {{2, 300, 8, 8, 64},    {1, 300, 8, 4, 128}, {2, 131, 8, 1, 64},
                                   {8, 2048, 16, 8, 128}, {1, 257, 4, 2, 256}, {1, 64, 2, 1, 72}};
  int failures = 0;
  for (const Size& z : sizes) {
    for (const Pass pass : {Pass::forward, Pass::backward}) {
      const GraphKey key{pass, DType::bf16, z.batch, z.seq, z.heads, z.kv_heads, z.head_dim};
      const std::string refused = refusal(key);
      std::printf("%-44s %s\n", name(key).c_str(), refused.empty() ? "ok" : refused.c_str());
      if (!refused.empty()) ++failures;
    }
  }
  for (const Pass pass : {Pass::forward, Pass::backward}) {
    const GraphKey key{pass, DType::bf16, 1, 64, 2, 1, 100};
    const std::string refused = refusal(key);
    // The forward's and the backward's checks word it differently; both name the multiple of 8.
    const bool as_expected =
        refused.find("hidden_dim should be multiple of 8") != std::string::npos;
    std::printf("%-44s %s%s\n", name(key).c_str(), as_expected ? "refused as expected: " : "FAIL: ",
                refused.empty() ? "validated" : refused.c_str());
    if (!as_expected) ++failures;
  }
  if (failures > 0) {
    std::fprintf(stderr, "titan_cudnn_attention_graphs_check: %d graphs wrong\n", failures);
    return 1;
  }
  std::printf("titan_cudnn_attention_graphs_check: ok\n");
  return 0;
}
