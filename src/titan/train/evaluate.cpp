#include "titan/train/evaluate.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/core/progress.h"
#include "titan/dispatch/device_ops.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/peft_adapter.h"

namespace titan {

std::unique_ptr<CausalLM> load_eval_model(const std::string& dir, DType compute,
                                          bool allow_nonfinite, const std::string& adapter) {
  std::unique_ptr<CausalLM> model;
  if (!adapter.empty()) {
    model = load_hf_model(dir, {}, allow_nonfinite, compute);
    merge_peft_adapter(adapter, model->args(), model->param_groups());
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
  for (const auto& [param, copy] : rounded_after_load) {
    for (const ParamGroup& g : model->param_groups()) {
      if (const ParamView* v = g.find(param)) {
        device_ops().round_to_bf16(copy, g.params() + v->offset,
                                   v->numel);  // as the model's copies are
      }
    }
  }
  model->set_forward_only();
  return model;
}

EvalResult evaluate(CausalLM& model, DataLoader& loader, int64_t max_batches) {
  EvalResult result;
  double loss_sum = 0.0;
  Progress progress("evaluating", std::max<int64_t>(max_batches, 0), ProgressUnit::batches);
  while (max_batches < 0 || result.batches < max_batches) {
    std::optional<Batch> b = loader.next_batch();
    if (!b) break;
    ForwardOptions options;  // packed rows' segments, as the loader made them
    options.segment_start = b->segment_start.empty() ? nullptr : b->segment_start.data();
    const CrossEntropyResult r =
        model.forward(b->input_ids.data(), b->labels.data(), b->batch_size, b->seq_len, options);
    loss_sum += r.loss_sum;
    result.tokens += r.n_scored;
    ++result.batches;
    progress.advance(1);
  }
  progress.finish();
  TITAN_CHECK(result.tokens > 0, "evaluation: the data gave no full batch with scored tokens");
  result.loss = loss_sum / static_cast<double>(result.tokens);
  return result;
}

}  // namespace titan
