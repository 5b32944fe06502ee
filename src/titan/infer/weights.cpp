#include "titan/infer/weights.h"

#include <filesystem>

#include "titan/core/error.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"

namespace titan {
namespace {

GemvWeight f32_weight(const Linear& l) {
  return {DType::f32, l.weight, l.out_features, l.in_features};
}

}  // namespace

InferenceWeights::InferenceWeights(const Qwen3Model& model, DType dtype)
    : model_(model), dtype_(dtype) {
  TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16, "inference weights in ",
              dtype_name(dtype), ": only F32 and BF16 are supported");
  const ModelArgs& a = model.args();
  for (const DecoderLayer& l : model.layers()) {
    const SelfAttention& s = l.self_attn;
    layers_.push_back({f32_weight(s.q_proj), f32_weight(s.k_proj), f32_weight(s.v_proj),
                       f32_weight(s.o_proj), f32_weight(l.mlp.gate_proj), f32_weight(l.mlp.up_proj),
                       f32_weight(l.mlp.down_proj)});
  }
  lm_head_ = {DType::f32, model.lm_head_weight(), a.vocab_size, a.hidden_size};
  if (dtype == DType::f32) return;

  std::vector<GemvWeight*> all;
  for (LayerWeights& l : layers_) {
    for (GemvWeight* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) all.push_back(w);
  }
  all.push_back(&lm_head_);
  int64_t total = 0;
  for (const GemvWeight* w : all) total += w->rows * w->cols;
  copies_ = Buffer(static_cast<size_t>(total) * sizeof(uint16_t), MemCategory::parameters);
  uint16_t* next = copies_.as<uint16_t>();
  for (GemvWeight* w : all) {
    const auto n = static_cast<size_t>(w->rows * w->cols);
    convert_from_f32(static_cast<const float*>(w->data), n, DType::bf16, next);
    *w = {DType::bf16, next, w->rows, w->cols};
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
