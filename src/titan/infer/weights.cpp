#include "titan/infer/weights.h"

#include <algorithm>
#include <filesystem>

#include "titan/core/error.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/forward_only_model.h"

namespace titan {

InferenceWeights::InferenceWeights(CausalLM& model) : model_(model) {
  const DType dtype = model.compute_dtype();
  TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16, "inference weights in ",
              dtype_name(dtype), ": only F32 and BF16 are supported");
  if (dtype == DType::f32) return;
  if (!model.compute_copies_held()) hold_copies_from_masters(model);
  const DecoderModules& m = model.modules();
  for (const ParamGroup& g : model.param_groups()) {
    copy_bytes_ += sizeof(uint16_t) * static_cast<size_t>(g.compute_copy_numel());
  }
  const Embedding& embed = m.embed_tokens;
  if (embed.weight_bf16 != nullptr && embed.weight_bf16 != m.lm_head.weight_bf16) {
    copy_bytes_ += sizeof(uint16_t) * static_cast<size_t>(embed.vocab * embed.dim);
  }
}

std::unique_ptr<InferenceWeights> InferenceWeights::load(const std::string& dir, DType dtype,
                                                         bool allow_nonfinite,
                                                         const std::string& adapter) {
  std::unique_ptr<CausalLM> model = load_forward_only_model(dir, dtype, allow_nonfinite, adapter);
  std::unique_ptr<InferenceWeights> weights(new InferenceWeights(*model));
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
