#include "titan/infer/weights.h"

#include <algorithm>
#include <filesystem>

#include "titan/core/error.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"

namespace titan {

InferenceWeights::InferenceWeights(const CausalLM& model, DType dtype)
    : model_(model), dtype_(dtype), modules_(model.modules()) {
  TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16, "inference weights in ",
              dtype_name(dtype), ": only F32 and BF16 are supported");
  std::vector<Linear*> all;
  for (DecoderLayer& l : modules_.layers) {
    SelfAttention& s = l.self_attn;
    for (Linear* w : {&s.q_proj, &s.k_proj, &s.v_proj, &s.o_proj}) all.push_back(w);
    if (!l.sparse) {
      for (Linear* w : {&l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) all.push_back(w);
    }
  }
  // A model that trains in bf16 keeps bf16 copies of its own; these weights are this object's.
  for (Linear* w : all) w->weight_bf16 = nullptr;
  modules_.lm_head.weight_bf16 = nullptr;
  if (dtype == DType::f32) return;
  int64_t total = modules_.lm_head.out_features * modules_.lm_head.in_features;
  for (const Linear* w : all) {
    const int64_t n = w->out_features * w->in_features;
    total += n;
    // A kernel without bf16 operands multiplies the widened weight (the lm_head only ever runs
    // as a GEMV).
    if (w->kernel->forward_bf16 == nullptr) widened_floats_ = std::max(widened_floats_, n);
  }
  all.push_back(&modules_.lm_head);
  copies_ = Buffer(static_cast<size_t>(total) * sizeof(uint16_t), MemCategory::parameters);
  uint16_t* next = copies_.as<uint16_t>();
  for (Linear* w : all) {
    const auto n = static_cast<size_t>(w->out_features * w->in_features);
    convert_from_f32(w->weight, n, DType::bf16, next);
    w->weight_bf16 = next;
    next += n;
  }
}

DType inference_dtype(const std::string& model_dir, const std::string& requested) {
  if (requested == "bfloat16" || requested == "bf16") return DType::bf16;
  if (requested == "float32" || requested == "fp32") return DType::f32;
  TITAN_CHECK(requested.empty() || requested == "auto", "weight dtype ", json_quote(requested),
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
