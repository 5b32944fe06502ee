#include "titan/models/forward_only_model.h"

#include <utility>
#include <vector>

#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/peft_adapter.h"

namespace titan {

void round_from_master(const CausalLM& model, const std::string& param, uint16_t* copy) {
  for (const ParamGroup& g : model.param_groups()) {
    if (const ParamView* v = g.find(param)) {
      device_ops().round_to_bf16(copy, g.params() + v->offset, v->numel);
      return;
    }
  }
  fail("model: no parameter ", param, " to round into its bf16 copy");
}

void hold_copies_from_masters(CausalLM& model) {
  for (const std::vector<ComputeCopyTarget>& group : model.hold_compute_copies(false)) {
    for (const ComputeCopyTarget& t : group) round_from_master(model, t.param, t.copy);
  }
}

std::unique_ptr<CausalLM> load_forward_only_model(const std::string& dir, DType compute,
                                                  bool allow_nonfinite,
                                                  const std::string& adapter) {
  std::unique_ptr<CausalLM> model;
  if (!adapter.empty()) {
    model = load_hf_model(dir, {}, allow_nonfinite, compute);
    merge_peft_adapter(adapter, model->args(), model->param_groups());
    if (compute == DType::bf16) hold_copies_from_masters(*model);
    model->set_forward_only();
    return model;
  }
  // bf16: the copies loaded from the folder, and the one copy made from a master the forward
  // reads too (the lm_head's of a tied embedding kept in fp32 for the lookup).
  std::vector<std::pair<std::string, uint16_t*>> rounded_after_load;
  if (compute != DType::bf16) {
    model = load_hf_model(dir, {}, allow_nonfinite, compute);
  } else {
    const auto held = [&](CausalLM& m, const SafetensorsCheckpoint& checkpoint) {
      const bool lookup_in_bf16 = embedding_held_in_bf16(m, checkpoint);
      const std::string embedding = m.modules().embed_tokens.name + ".weight";
      Bf16Destinations destinations;
      for (const std::vector<ComputeCopyTarget>& group : m.hold_compute_copies(lookup_in_bf16)) {
        for (const ComputeCopyTarget& t : group) {
          if (t.param == embedding && !lookup_in_bf16) {
            rounded_after_load.emplace_back(t.param, t.copy);
          } else {
            destinations.emplace(t.param, t.copy);
          }
        }
      }
      return destinations;
    };
    model = load_hf_model_bf16_only(dir, allow_nonfinite, held);
  }
  for (const auto& [param, copy] : rounded_after_load) round_from_master(*model, param, copy);
  model->set_forward_only();
  return model;
}

}  // namespace titan
