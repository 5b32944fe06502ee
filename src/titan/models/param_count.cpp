#include "titan/models/param_count.h"

#include "titan/models/parallelize.h"

namespace titan {

ParamCounts count_parameters(const ModelArgs& a, const ParallelizePlan& plan) {
  ParamCounts c;
  for (const ParamGroupSpec& g : local_param_specs(a, plan)) {
    for (const ParamSpec& p : g.params) {
      const int64_t n = shape_numel(p.shape);
      c.total += n;
      if (p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight") c.embedding += n;
      // Stacked experts (E, out, in): a token uses k of the E this rank holds.
      c.active += p.shape.size() == 3 ? n / p.shape[0] * a.num_experts_per_tok : n;
    }
  }
  return c;
}

}  // namespace titan
