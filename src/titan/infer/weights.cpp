#include "titan/infer/weights.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/peft_adapter.h"

namespace titan {

InferenceWeights::InferenceWeights(const CausalLM& model, DType dtype)
    : InferenceWeights(model, dtype, true, false) {}

InferenceWeights::InferenceWeights(const CausalLM& model, DType dtype, bool fill,
                                   bool embedding_in_bf16)
    : model_(model), dtype_(dtype), modules_(model.modules()) {
  TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16, "inference weights in ",
              dtype_name(dtype), ": only F32 and BF16 are supported");
  const std::vector<Linear*> all = modules_.matmul_linears();  // the lm_head last
  // A model that trains in bf16 keeps bf16 copies of its own; these weights are this object's.
  for (Linear* w : all) w->weight_bf16 = nullptr;
  for (DecoderLayer& l : modules_.layers) l.moe.weights_bf16 = {};
  Embedding& embed = modules_.embed_tokens;
  embed.weight_bf16 = nullptr;
  if (dtype == DType::f32) return;
  // A tied embedding in bf16 is the lm_head's copy; an untied one gets its own.
  const bool tied = modules_.lm_head.weight == embed.weight;
  int64_t total = embedding_in_bf16 && !tied ? embed.vocab * embed.dim : 0;
  for (const Linear* w : all) {
    const int64_t n = w->out_features * w->in_features;
    total += n;
    // A kernel without bf16 operands multiplies the widened weight (the lm_head only ever runs
    // as a GEMV).
    if (w != &modules_.lm_head && w->kernel->forward_bf16 == nullptr) {
      widened_floats_ = std::max(widened_floats_, n);
    }
  }
  for (const DecoderLayer& l : modules_.layers) {
    if (l.sparse) total += 3 * l.moe.n_experts * l.moe.intermediate * l.moe.hidden;
  }
  copies_ = Buffer(backend().memory(), static_cast<size_t>(total) * sizeof(uint16_t),
                   MemCategory::parameters);
  uint16_t* next = copies_.as<uint16_t>();
  const auto lay_out = [&](int64_t numel) {
    const uint16_t* copy = next;
    next += numel;
    return copy;
  };
  for (Linear* w : all) w->weight_bf16 = lay_out(w->out_features * w->in_features);
  // The stacked experts too (not the router, which computes in fp32), as DecoderLM in bf16 does.
  for (DecoderLayer& l : modules_.layers) {
    if (!l.sparse) continue;
    SparseMoeBlock& moe = l.moe;
    const int64_t n = moe.n_experts * moe.intermediate * moe.hidden;
    moe.weights_bf16 = {lay_out(n), lay_out(n), lay_out(n)};
  }
  if (embedding_in_bf16) {
    embed.weight_bf16 = tied ? modules_.lm_head.weight_bf16 : lay_out(embed.vocab * embed.dim);
  }
  if (!fill) return;
  for_each_copy([](const float* master, uint16_t* copy, int64_t numel) {
    convert_from_f32(master, static_cast<size_t>(numel), DType::bf16, copy);
  });
}

template <typename Fn>
void InferenceWeights::for_each_copy(const Fn& fn) {
  // The copies are this object's: their pointers in modules_ are read-only views of copies_.
  uint16_t* base = copies_.as<uint16_t>();
  const auto own = [&](const uint16_t* copy) { return base + (copy - base); };
  for (Linear* w : modules_.matmul_linears()) {
    fn(w->weight, own(w->weight_bf16), w->out_features * w->in_features);
  }
  for (DecoderLayer& l : modules_.layers) {
    if (!l.sparse) continue;
    const SparseMoeBlock& moe = l.moe;
    const int64_t n = moe.n_experts * moe.intermediate * moe.hidden;
    fn(moe.weights.gate, own(moe.weights_bf16.gate), n);
    fn(moe.weights.up, own(moe.weights_bf16.up), n);
    fn(moe.weights.down, own(moe.weights_bf16.down), n);
  }
  const Embedding& embed = modules_.embed_tokens;
  if (embed.weight_bf16 != nullptr && embed.weight_bf16 != modules_.lm_head.weight_bf16) {
    fn(embed.weight, own(embed.weight_bf16), embed.vocab * embed.dim);
  }
}

std::unique_ptr<InferenceWeights> InferenceWeights::load(const std::string& dir, DType dtype,
                                                         bool allow_nonfinite,
                                                         const std::string& adapter) {
  if (dtype != DType::bf16 || !adapter.empty()) {
    std::unique_ptr<CausalLM> model = load_hf_model(dir, {}, allow_nonfinite);
    if (!adapter.empty()) merge_peft_adapter(adapter, model->args(), model->param_groups());
    std::unique_ptr<InferenceWeights> weights(new InferenceWeights(*model, dtype, true, false));
    weights->owned_ = std::move(model);
    return weights;
  }
  std::unique_ptr<InferenceWeights> weights;
  // The parameters held only in bf16, and the parameter each copy is made from (by its master's
  // address in the model's groups).
  std::unordered_set<std::string> held_in_bf16;
  std::unordered_map<const float*, std::string> names;
  const auto load_bf16 = [&](CausalLM& m, const SafetensorsCheckpoint& checkpoint) {
    const Embedding& embed = m.modules().embed_tokens;
    const std::string embed_name = embed.name + ".weight";
    const bool embedding_in_bf16 = embedding_held_in_bf16(m, checkpoint);
    weights.reset(new InferenceWeights(m, DType::bf16, false, embedding_in_bf16));
    for (const ParamGroup& g : m.param_groups()) {
      for (const ParamView& v : g.views()) names.emplace(g.params() + v.offset, v.spec.name);
    }
    for (const std::vector<ComputeCopyTarget>& group : m.bf16_only_params()) {
      for (const ComputeCopyTarget& t : group) held_in_bf16.insert(t.param);
    }
    if (embedding_in_bf16) held_in_bf16.insert(embed_name);
    Bf16Destinations destinations;
    weights->for_each_copy([&](const float* master, uint16_t* copy, int64_t) {
      const std::string& name = names.at(master);
      if (held_in_bf16.count(name) != 0) destinations.emplace(name, copy);
    });
    return destinations;
  };
  std::unique_ptr<CausalLM> model = load_hf_model_bf16_only(dir, allow_nonfinite, load_bf16);
  // A copy of a parameter also held in fp32 (a tied lm_head of an fp32 embedding) is made from
  // it; the masters of the rest were never loaded, so nothing may read them.
  DecoderModules& m = weights->modules_;
  weights->for_each_copy([&](const float* master, uint16_t* copy, int64_t numel) {
    if (held_in_bf16.count(names.at(master)) == 0) {
      convert_from_f32(master, static_cast<size_t>(numel), DType::bf16, copy);
    }
  });
  for (Linear* w : m.matmul_linears()) {
    if (held_in_bf16.count(names.at(w->weight)) != 0) w->weight = nullptr;
  }
  for (DecoderLayer& l : m.layers) l.moe.weights = {};
  if (m.embed_tokens.weight_bf16 != nullptr) m.embed_tokens.weight = nullptr;
  weights->owned_ = std::move(model);
  return weights;
}

DType inference_dtype(const std::string& model_dir, const std::string& requested) {
  if (requested == "bfloat16" || requested == "bf16") return DType::bf16;
  if (requested == "float32" || requested == "fp32") return DType::f32;
  TITAN_CHECK(requested == "auto", "weight dtype ", json_quote(requested),
              " is not one of auto, bfloat16, float32 (or bf16, fp32)");
  const std::string config = (std::filesystem::path(model_dir) / "config.json").string();
  const nlohmann::json j = read_json_file(config, "config.json", 4);
  for (const char* key : {"dtype", "torch_dtype"}) {  // Transformers 5.x, 4.x
    if (j.contains(key) && j[key].is_string()) {
      return j[key].get<std::string>() == "bfloat16" ? DType::bf16 : DType::f32;
    }
  }
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(model_dir);
  const SafetensorsEntry& embedding = checkpoint.at("model.embed_tokens.weight");
  return embedding.dtype == DType::bf16 ? DType::bf16 : DType::f32;
}

}  // namespace titan
