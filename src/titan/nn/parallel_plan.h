// A parallelize plan: how each module's parameters lie over the ranks of the tensor-parallel and
// expert-parallel axes (torchtitan's per-model parallelize function, its ParallelStyles and the
// DTensor placements they give the parameters). Resolved before the model is built, beside
// [overrides]: the model allocates and computes on each parameter's local part (local_spec), the
// loaders cut the same way, and the collectives the styles imply run at the decoder layer's
// boundaries (nn/layers.h's LayerCollectives).
//
// The placement of a parameter of rank r (2 for a linear's (out, in) weight, 3 for stacked experts
// (E, out, in)) under each style:
//   replicate  whole on every rank (norms, the router, biases of row-wise linears)
//   colwise    its output features cut: dim r - 2 (a bias: dim 0) over the TP axis
//   rowwise    its input features cut: dim r - 1 over the TP axis; a bias replicated (added once:
//              by the first TP rank, to its part of the products the group sums)
//   sequence   the parameters replicated; the module's activations cut along the sequence (norms)
//   vocab      the vocabulary (dim 0 of the embedding or the lm_head) cut over the TP axis
//   expert     whole experts (dim 0 of stacked experts) cut over the EP axis
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"

namespace titan {

enum class ParallelStyle { replicate, colwise, rowwise, sequence, vocab, expert };
const char* parallel_style_name(ParallelStyle style);

// One module pattern and its style: a glob over module names as [overrides] writes them ('*' may
// cross dots), matched against a parameter's module (its name less ".weight" / ".bias"; a stacked
// experts parameter, e.g. model.layers.0.mlp.experts.gate_proj, is its own module).
struct ParallelRule {
  std::string module;
  ParallelStyle style = ParallelStyle::replicate;
};

// This rank's place on the axes a plan cuts over: index of degree on each.
struct ParallelAxes {
  int64_t tp_index = 0, tp_degree = 1;  // tensor parallel
  int64_t ep_index = 0, ep_degree = 1;  // expert parallel
  bool sequence_parallel = false;       // norms and residual adds on sequence parts (TP only)
};

class ParallelizePlan {
 public:
  // Every parameter replicated, one rank: the model as it is built without parallelism.
  ParallelizePlan() = default;
  ParallelizePlan(ParallelAxes axes, std::vector<ParallelRule> rules)
      : axes_(axes), rules_(std::move(rules)) {}

  const ParallelAxes& axes() const { return axes_; }
  const std::vector<ParallelRule>& rules() const { return rules_; }
  // The style of `module`: the first rule whose glob matches it, else replicate.
  ParallelStyle style_of(const std::string& module) const;
  // Where this rank's part of `param` lies (count 1: replicated).
  Shard placement_of(const ParamSpec& param) const;
  // This rank's part of `param`: its placement's dimension divided by the degree. A dimension the
  // degree does not divide is a titan::Error naming the parameter, the style and the key.
  ParamSpec local_spec(const ParamSpec& param) const;
  // The FSDP cut of `param` on a rank whose other parameters' cut is `fsdp` (dim 0 over
  // dp_shard): under expert parallel an expert is sharded over the ranks holding the same experts
  // (distributed/mesh.h: shard index / (ep / tp) of dp_shard x tp / ep), torchtitan's;
  // otherwise `fsdp` itself (and whole, count 1, without FSDP).
  Shard fsdp_cut_of(const ParamSpec& param, Shard fsdp) const;
  // Whether any parameter of `specs` is cut: a model computing on parts needs the collectives.
  bool cuts_any(const std::vector<ParamSpec>& specs) const;

 private:
  ParallelAxes axes_;
  std::vector<ParallelRule> rules_;
};

// The module a parameter belongs to, as plan rules name it.
std::string module_of_param(const std::string& param);

}  // namespace titan
