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
  const std::vector<Linear*> all = modules_.matmul_linears();  // the lm_head last
  // A model that trains in bf16 keeps bf16 copies of its own; these weights are this object's.
  for (Linear* w : all) w->weight_bf16 = nullptr;
  for (DecoderLayer& l : modules_.layers) l.moe.weights_bf16 = {};
  if (dtype == DType::f32) return;
  int64_t total = 0;
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
  copies_ = Buffer(static_cast<size_t>(total) * sizeof(uint16_t), MemCategory::parameters);
  uint16_t* next = copies_.as<uint16_t>();
  const auto copy = [&](const float* master, int64_t numel) {
    convert_from_f32(master, static_cast<size_t>(numel), DType::bf16, next);
    const uint16_t* copied = next;
    next += numel;
    return copied;
  };
  for (Linear* w : all) w->weight_bf16 = copy(w->weight, w->out_features * w->in_features);
  // The stacked experts too (not the router, which computes in fp32), as DecoderLM in bf16 does.
  for (DecoderLayer& l : modules_.layers) {
    if (!l.sparse) continue;
    SparseMoeBlock& moe = l.moe;
    const int64_t n = moe.n_experts * moe.intermediate * moe.hidden;
    moe.weights_bf16 = {copy(moe.weights.gate, n), copy(moe.weights.up, n),
                        copy(moe.weights.down, n)};
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
