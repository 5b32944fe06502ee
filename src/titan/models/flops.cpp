#include "titan/models/flops.h"

#include "titan/models/parallelize.h"

namespace titan {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

double training_flops_per_token(const ModelArgs& a, int64_t seq_len, const ParallelizePlan& plan) {
  double n_mm = 0.0, q_rows = 0.0;
  for (const ParamGroupSpec& g : local_param_specs(a, plan)) {
    for (const ParamSpec& p : g.params) {
      const auto n = static_cast<double>(shape_numel(p.shape));
      if (p.shape.size() == 3) {
        // Stacked experts (E, out, in): each token's rows go through k of them.
        n_mm += n / static_cast<double>(p.shape[0]) * static_cast<double>(a.num_experts_per_tok);
      } else if (ends_with(p.name, "_proj.weight") || ends_with(p.name, ".mlp.gate.weight") ||
                 p.name == "lm_head.weight" ||
                 (a.tie_word_embeddings && p.name == "model.embed_tokens.weight")) {
        n_mm += n;  // the projections, the router, the lm_head (the embedding when tied)
      }
      if (ends_with(p.name, "self_attn.q_proj.weight")) q_rows += static_cast<double>(p.shape[0]);
    }
  }
  // QK^T and PV over every head this rank holds (q_proj's rows: heads x hd), forward and backward.
  return 6.0 * n_mm + 12.0 * q_rows * static_cast<double>(seq_len);
}

}  // namespace titan
