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
  // Each weight a bf16 copy serves, with the module's pointer to it. A model that trains in bf16
  // keeps copies of its own; these weights are this object's, so every pointer starts null.
  struct Target {
    const float* master;
    int64_t numel;
    const uint16_t** copy;
  };
  std::vector<Target> targets;
  for (Linear* w : modules_.matmul_linears()) {
    w->weight_bf16 = nullptr;
    const int64_t n = w->out_features * w->in_features;
    targets.push_back({w->weight, n, &w->weight_bf16});
    // A kernel without bf16 operands multiplies the widened weight (the lm_head only ever runs
    // as a GEMV).
    if (dtype == DType::bf16 && w != &modules_.lm_head && w->kernel->forward_bf16 == nullptr) {
      widened_floats_ = std::max(widened_floats_, n);
    }
  }
  for (DecoderLayer& l : modules_.layers) {
    if (!l.sparse) continue;
    SparseMoeBlock& moe = l.moe;  // the router (moe.gate) stays fp32
    moe.weights_bf16 = {};
    // An experts kernel that takes only fp32 (an override) keeps the fp32 weights.
    if (moe.experts->forward_bf16 == nullptr) continue;
    const int64_t n = moe.n_experts * moe.intermediate * moe.hidden;  // each of the three
    targets.push_back({moe.weights.gate, n, &moe.weights_bf16.gate});
    targets.push_back({moe.weights.up, n, &moe.weights_bf16.up});
    targets.push_back({moe.weights.down, n, &moe.weights_bf16.down});
  }
  if (dtype == DType::f32) return;
  int64_t total = 0;
  for (const Target& t : targets) total += t.numel;
  copies_ = Buffer(static_cast<size_t>(total) * sizeof(uint16_t), MemCategory::parameters);
  uint16_t* next = copies_.as<uint16_t>();
  for (const Target& t : targets) {
    convert_from_f32(t.master, static_cast<size_t>(t.numel), DType::bf16, next);
    *t.copy = next;
    next += t.numel;
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
