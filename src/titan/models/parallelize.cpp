#include "titan/models/parallelize.h"

#include <string>
#include <vector>

#include "titan/core/error.h"
#include "titan/nn/shard_runs.h"

namespace titan {
namespace {

// `key` of `count` must be divisible by the degree the plan cuts it over.
void require_divides(int64_t degree, const char* degree_key, int64_t count, const char* count_key,
                     const char* why) {
  TITAN_CHECK(count % degree == 0, "parallelism.", degree_key, " ", degree, " must divide ",
              count_key, " ", count, " (", why, ")");
}

}  // namespace

ParallelizePlan parallelize_decoder(const ModelArgs& args, const ParallelAxes& axes) {
  TITAN_CHECK(axes.tp_degree >= 1 && axes.tp_index >= 0 && axes.tp_index < axes.tp_degree,
              "parallelize: tensor-parallel rank ", axes.tp_index, " of ", axes.tp_degree);
  TITAN_CHECK(axes.ep_degree >= 1 && axes.ep_index >= 0 && axes.ep_index < axes.ep_degree,
              "parallelize: expert-parallel rank ", axes.ep_index, " of ", axes.ep_degree);
  const int64_t tp = axes.tp_degree, ep = axes.ep_degree;
  const char* tp_key = "tensor_parallel_degree";
  require_divides(tp, tp_key, args.num_attention_heads, "num_attention_heads",
                  "q_proj and o_proj are cut into whole heads");
  require_divides(tp, tp_key, args.num_key_value_heads, "num_key_value_heads",
                  "k_proj and v_proj are cut into whole key/value heads, as torchtitan does");
  require_divides(tp, tp_key, args.vocab_size, "vocab_size",
                  "the embedding and the lm_head are cut along the vocabulary");
  bool dense = false;
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) dense |= !args.layer_is_sparse(i);
  if (dense) {
    require_divides(tp, tp_key, args.intermediate_size, "intermediate_size",
                    "gate_proj and up_proj are cut column-wise, down_proj row-wise");
  }
  if (args.is_moe()) {
    require_divides(ep, "expert_parallel_degree", args.num_experts, "num_experts",
                    "each rank holds whole experts");
    if (ep == 1) {
      require_divides(tp, tp_key, args.moe_intermediate_size, "moe_intermediate_size",
                      "the experts' gate and up projections are cut column-wise, down row-wise");
    }
  } else {
    TITAN_CHECK(ep == 1, "parallelism.expert_parallel_degree ", ep, " needs a model with experts (",
                args.architecture, " has none)");
  }

  const std::string layers = "model.layers.*.";
  std::vector<ParallelRule> rules = {
      {"model.embed_tokens", ParallelStyle::vocab},
      {layers + "input_layernorm", ParallelStyle::sequence},
      {layers + "self_attn.q_proj", ParallelStyle::colwise},
      {layers + "self_attn.k_proj", ParallelStyle::colwise},
      {layers + "self_attn.v_proj", ParallelStyle::colwise},
      {layers + "self_attn.q_norm", ParallelStyle::replicate},
      {layers + "self_attn.k_norm", ParallelStyle::replicate},
      {layers + "self_attn.o_proj", ParallelStyle::rowwise},
      {layers + "post_attention_layernorm", ParallelStyle::sequence},
      {layers + "mlp.gate_proj", ParallelStyle::colwise},
      {layers + "mlp.up_proj", ParallelStyle::colwise},
      {layers + "mlp.down_proj", ParallelStyle::rowwise},
      {layers + "mlp.gate", ParallelStyle::replicate},
  };
  if (ep > 1) {
    rules.push_back({layers + "mlp.experts.*", ParallelStyle::expert});
  } else {
    rules.push_back({layers + "mlp.experts.gate_proj", ParallelStyle::colwise});
    rules.push_back({layers + "mlp.experts.up_proj", ParallelStyle::colwise});
    rules.push_back({layers + "mlp.experts.down_proj", ParallelStyle::rowwise});
  }
  // LoRA's pairs (models/lora.h) on the dense linears: a column-wise linear's B (out, rank) cut
  // on its output rows like the base, its A whole; a row-wise linear's A (rank, in) cut on its
  // input columns like the base, its B whole. The experts' pairs are not cut (refused under EP:
  // train/job_resolve.cpp).
  for (const char* colwise : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                              "mlp.gate_proj", "mlp.up_proj"}) {
    rules.push_back({layers + colwise + ".lora_B", ParallelStyle::colwise});
  }
  for (const char* rowwise : {"self_attn.o_proj", "mlp.down_proj"}) {
    rules.push_back({layers + rowwise + ".lora_A", ParallelStyle::rowwise});
  }
  rules.push_back({"model.norm", ParallelStyle::sequence});
  rules.push_back({"lm_head", ParallelStyle::vocab});
  return ParallelizePlan(axes, std::move(rules));
}

std::vector<ParamGroupSpec> local_param_specs(const ModelArgs& args, const ParallelizePlan& plan) {
  std::vector<ParamGroupSpec> groups = model_param_specs(args);
  for (ParamGroupSpec& g : groups) {
    for (ParamSpec& p : g.params) p = plan.local_spec(p);
  }
  return groups;
}

ParamSpec whole_param_spec(const ParamSpec& local, const ParallelizePlan& plan) {
  const Shard cut = plan.placement_of(local);
  ParamSpec whole = local;
  if (cut.count > 1) whole.shape[static_cast<size_t>(cut.dim)] *= cut.count;
  return whole;
}

void initialize_local_group(ParamGroup& group, const ModelArgs& args, uint64_t seed,
                            const ParallelizePlan& plan) {
  const auto std = static_cast<float>(args.initializer_range);
  for (const ParamView& v : group.views()) {
    float* local = group.params() + v.offset;
    const Shard cut = plan.placement_of(v.spec);
    if (cut.count == 1) {
      initialize_param(v.spec, local, seed, std);
      continue;
    }
    const ParamSpec whole = whole_param_spec(v.spec, plan);
    std::vector<float> values(static_cast<size_t>(shape_numel(whole.shape)));
    initialize_param(whole, values.data(), seed, std);
    copy_part_out(shard_box(whole.shape, {cut}), values.data(), local);
  }
}

}  // namespace titan
