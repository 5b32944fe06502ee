// The weights an InferenceSession reads. Decode is bound by the bytes of weights read per token,
// so the linear weights (q/k/v/o, gate/up/down, lm_head) can be held in bf16: a copy rounded to
// nearest even, as torch's .to(torch.bfloat16), which halves those bytes; compute stays fp32
// (activations, accumulation, norms, the KV cache). With fp32 they are the model's own
// parameters, not copied. The model keeps its fp32 parameters either way (the norms and the
// embedding are read from there), so a bf16 session costs 1.5x an fp32 one in memory. MoE
// routers and experts are read from the fp32 parameters in either dtype (no bf16 experts path
// yet): exact for a bf16 folder, whose loaded values are bf16 already, but not rounded when
// --dtype bfloat16 is asked of an fp32 MoE folder.
#pragma once

#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/nn/qwen3.h"
#include "titan/ops/gemv.h"

namespace titan {

struct LayerWeights {
  GemvWeight q, k, v, o;      // (H*hd, h), (KV*hd, h), (KV*hd, h), (h, H*hd)
  GemvWeight gate, up, down;  // (I, h), (I, h), (h, I)
};

class InferenceWeights {
 public:
  // dtype f32 or bf16 (else titan::Error). The model must outlive this object.
  InferenceWeights(const Qwen3Model& model, DType dtype);

  const Qwen3Model& model() const { return model_; }
  DType dtype() const { return dtype_; }
  const LayerWeights& layer(size_t i) const { return layers_[i]; }
  const GemvWeight& lm_head() const { return lm_head_; }  // (V, h)
  size_t copy_bytes() const { return copies_.bytes(); }   // 0 for f32

 private:
  const Qwen3Model& model_;
  DType dtype_;
  Buffer copies_;  // the bf16 copies, one allocation
  std::vector<LayerWeights> layers_;
  GemvWeight lm_head_;
};

// The weight dtype `titan generate --dtype` names: "auto" (or empty) is the model folder's
// dtype as Transformers' torch_dtype="auto" takes it -- config.json's dtype / torch_dtype, else
// the stored embedding's -- with float16 folders run with fp32 weights (no fp16 path); "bfloat16"
// / "bf16" and "float32" / "fp32" force one. Anything else is a titan::Error.
DType inference_dtype(const std::string& model_dir, const std::string& requested);

}  // namespace titan
