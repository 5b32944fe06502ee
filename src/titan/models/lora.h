// LoRA adapters of a decoder model, as PEFT names and computes them: one (A, B) pair per adapted
// linear, A (rank, in) Kaiming-uniform and B (out, rank) zero at start, the update
// scaling * B A with scaling = alpha / rank (nn/lora.h computes it). The adapter's parameters live
// in their own flat groups, one per decoder layer ("model.layers.{i}.lora"), named
// "<module>.lora_A.weight" / "<module>.lora_B.weight" (PEFT's keys without its
// "base_model.model." prefix), so the optimizer, checkpoints and data parallelism take them as
// they take a model's groups, while the model's own groups are frozen (no gradients, no AdamW
// state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/models/model_args.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/lora.h"
#include "titan/nn/parallel_plan.h"
#include "titan/nn/param_group.h"

namespace titan {

// The projections PEFT's target_modules may name in a Llama-family decoder layer.
const std::vector<std::string>& lora_module_names();

struct LoraOptions {
  int64_t rank = 0;  // 0: no LoRA
  double alpha = 16.0;
  std::vector<std::string> target_modules;  // PEFT's short names, a subset of lora_module_names
  double dropout = 0.0;  // lora.dropout: the drop probability of the adapter's input, in [0, 1)
  double scaling() const { return alpha / static_cast<double>(rank); }
  bool targets(const std::string& module) const;  // whether target_modules names it
};

// One adapted stacked expert parameter of a sparse layer, as PEFT (0.21, on Transformers 5's
// fused experts) adapts it when target_modules names the MLP's projections: gate_proj and up_proj
// together become the fused gate_up_proj, with rank 2r (and alpha 2 alpha: PEFT's rank_pattern
// and alpha_pattern), down_proj keeps rank r; nn/lora.h ExpertLora computes them.
struct ExpertLoraSite {
  std::string prefix;  // model.layers.{i}.mlp.experts[.base_layer]: the keys' prefix
  enum Param { gate_up, down } param;
  int64_t rank;     // per expert
  int64_t in, out;  // of one expert's (fused) projection
};
std::vector<ExpertLoraSite> expert_lora_sites(const ModelArgs& args, const LoraOptions& options,
                                              const std::string& layer);

// "q_proj,k_proj" -> its names; `where` names the source in the error for an unknown, repeated
// or empty name.
std::vector<std::string> parse_lora_targets(const std::string& list, const std::string& where);
// The adapter's parameter groups for a model of `args`: per decoder layer, A then B of each
// target in layer order (q, k, v, o, gate, up, down); on a MoE model the MLP targets adapt the
// sparse layers' experts (expert_lora_sites, after the attention's) and not the dense layers'
// MLPs, as PEFT does. A titan::Error for a rank below 1, gate_proj without up_proj (or the
// reverse) on a MoE model, or dropout with a MoE model's experts adapted (PEFT refuses both:
// its ParamWrapper merges the update into the weight, which leaves no input to drop out).
std::vector<ParamGroupSpec> lora_param_specs(const ModelArgs& args, const LoraOptions& options);

// The adapter's groups and, per adapted linear, the LoraLinear a model's module points at
// (CausalLM::attach_lora). Under tensor parallel (`plan`, the model's: models/parallelize.h) the
// groups hold this rank's cut of each pair -- a column-wise linear's B rows, a row-wise one's A
// columns, the other matrix whole -- and each LoraLinear computes on the rank's part of its base:
// a column-wise one's output (its dx a partial the block sums with the base's), a row-wise one's
// partial output, summed with the base's at the block boundary, so the adapter adds no
// collective to the forward. What the cuts leave partial are the whole matrices' gradients
// (column-wise A's, row-wise B's), summed over the TP group by the trainer (Parallelism).
class LoraAdapter {
 public:
  LoraAdapter(const ModelArgs& args, const LoraOptions& options,
              const ParallelizePlan& plan = ParallelizePlan());
  LoraAdapter(const LoraAdapter&) = delete;
  LoraAdapter& operator=(const LoraAdapter&) = delete;

  const LoraOptions& options() const { return options_; }
  // Whether the model is MoE: its MLP targets are then the sparse layers' experts.
  bool moe() const { return moe_; }
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // The whole adapter's groups (what checkpoints and the PEFT folder hold), and the plan the
  // groups are cut by.
  const std::vector<ParamGroupSpec>& specs() const { return specs_; }
  const ParallelizePlan& plan() const { return plan_; }
  // The update of module `name` (e.g. model.layers.0.self_attn.q_proj), or null when not adapted.
  const LoraLinear* find(const std::string& module) const;
  const std::vector<LoraLinear>& linears() const { return linears_; }
  // The update of a sparse layer's experts (e.g. model.layers.0.mlp.experts), or null.
  const ExpertLora* find_experts(const std::string& experts) const;
  const std::vector<ExpertLora>& experts() const { return experts_; }

  // A Kaiming-uniform (deterministic in `seed`, per parameter name), B zero: PEFT's init; under
  // TP each rank's cut of the whole pair's values.
  void initialize(uint64_t seed);
  void allocate_gradients();
  void zero_gradients();
  // Around one training micro-batch's forward and backward: its (B, S) tokens' rows are
  // [first_row, first_row + B) of step `step`'s global batch (ops/lora_dropout.h's key). Nothing
  // without dropout. end_dropout: none until the next begin (validation, export).
  void begin_dropout(uint64_t seed, int64_t step, int64_t first_row, int64_t seq_len);
  void end_dropout();

 private:
  LoraOptions options_;
  ParallelizePlan plan_;
  bool moe_ = false;
  std::vector<ParamGroupSpec> specs_;
  std::vector<ParamGroup> groups_;
  std::vector<LoraLinear> linears_;
  std::vector<ExpertLora> experts_;
  std::unique_ptr<LoraScratch> scratch_;
  std::unique_ptr<ExpertLoraScratch> expert_scratch_;
  // Per experts_ entry: its layer's group and the sites its views are named by.
  std::vector<std::pair<size_t, std::vector<ExpertLoraSite>>> expert_sites_;
  void bind();  // points every LoraLinear at its views
};

}  // namespace titan
