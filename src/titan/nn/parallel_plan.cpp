#include "titan/nn/parallel_plan.h"

#include <algorithm>
#include <string_view>

#include "titan/core/error.h"
#include "titan/dispatch/overrides.h"

namespace titan {

const char* parallel_style_name(ParallelStyle style) {
  switch (style) {
    case ParallelStyle::replicate:
      return "replicate";
    case ParallelStyle::colwise:
      return "colwise";
    case ParallelStyle::rowwise:
      return "rowwise";
    case ParallelStyle::sequence:
      return "sequence";
    case ParallelStyle::vocab:
      return "vocab";
    case ParallelStyle::expert:
      return "expert";
  }
  return "?";
}

std::string module_of_param(const std::string& param) {
  for (std::string_view tail : {".weight", ".bias"}) {
    if (param.size() > tail.size() &&
        param.compare(param.size() - tail.size(), tail.size(), tail) == 0) {
      return param.substr(0, param.size() - tail.size());
    }
  }
  return param;
}

ParallelStyle ParallelizePlan::style_of(const std::string& module) const {
  const auto it = std::find_if(rules_.begin(), rules_.end(),
                               [&](const ParallelRule& r) { return glob_match(r.module, module); });
  return it == rules_.end() ? ParallelStyle::replicate : it->style;
}

Shard ParallelizePlan::placement_of(const ParamSpec& param) const {
  const ParallelStyle style = style_of(module_of_param(param.name));
  const auto rank = static_cast<int64_t>(param.shape.size());
  const bool bias = rank == 1;
  const Shard tp_cut = {axes_.tp_index, axes_.tp_degree, 0};
  switch (style) {
    case ParallelStyle::replicate:
    case ParallelStyle::sequence:
      return {};
    case ParallelStyle::colwise:
      return {tp_cut.index, tp_cut.count, bias ? 0 : rank - 2};
    case ParallelStyle::rowwise:
      if (bias) return {};
      return {tp_cut.index, tp_cut.count, rank - 1};
    case ParallelStyle::vocab:
      return tp_cut;
    case ParallelStyle::expert:
      return {axes_.ep_index, axes_.ep_degree, 0};
  }
  return {};
}

Shard ParallelizePlan::fsdp_cut_of(const ParamSpec& param, Shard fsdp) const {
  if (fsdp.count == 1 || axes_.ep_degree == 1 ||
      style_of(module_of_param(param.name)) != ParallelStyle::expert) {
    return fsdp;
  }
  // An EP group spans ep / tp shard indices (whole TP groups), so the ranks holding the same
  // experts in a replica are the shard indices' runs of that length.
  const int64_t span = axes_.ep_degree / axes_.tp_degree;
  TITAN_CHECK(axes_.ep_degree % axes_.tp_degree == 0 && fsdp.dim == 0 && fsdp.count % span == 0,
              "parallelize: the experts' FSDP cut of ", fsdp.count, " shards under ",
              axes_.ep_degree, " expert-parallel ranks and ", axes_.tp_degree,
              " tensor-parallel ranks");
  return {fsdp.index / span, fsdp.count / span, 0};
}

ParamSpec ParallelizePlan::local_spec(const ParamSpec& param) const {
  const Shard cut = placement_of(param);
  if (cut.count == 1) return param;
  const auto dim = static_cast<size_t>(cut.dim);
  TITAN_CHECK(dim < param.shape.size(), "parallelize: ", param.name, " of shape ",
              shape_str(param.shape), " has no dimension ", cut.dim, " to cut ",
              parallel_style_name(style_of(module_of_param(param.name))));
  const int64_t d = param.shape[dim];
  const bool expert = style_of(module_of_param(param.name)) == ParallelStyle::expert;
  TITAN_CHECK(
      d % cut.count == 0, "parallelize: ", param.name, " (",
      parallel_style_name(style_of(module_of_param(param.name))), ") has ", d, " along dimension ",
      cut.dim, ", which ",
      expert ? "parallelism.expert_parallel_degree " : "parallelism.tensor_parallel_degree ",
      cut.count, " does not divide");
  return cut.spec_of(param);
}

bool ParallelizePlan::cuts_any(const std::vector<ParamSpec>& specs) const {
  return std::any_of(specs.begin(), specs.end(),
                     [&](const ParamSpec& p) { return placement_of(p).count > 1; });
}

}  // namespace titan
