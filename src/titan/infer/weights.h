// The weights an InferenceSession reads: the model's module tree with its linear weights (q/k/v/o,
// gate/up/down, lm_head) either the model's own fp32 parameters or bf16 copies of them. Decode is
// bound by the bytes of weights read per token, so bf16 -- a copy rounded to nearest even, as
// torch's .to(torch.bfloat16) -- halves them, and with bf16 weights each matmul takes its input
// rounded to bf16 too (fp32 accumulation and outputs; bf16 GEMMs for a prompt, GEMVs widening in
// registers for one token), as mixed-precision training computes; norms, RoPE, attention, SwiGLU
// and the residual stream stay fp32 (the KV cache's dtype is the session's choice). The norms,
// biases and routers are read from the model's fp32 parameters. Made from a live model, the copies
// sit beside its fp32 masters (1.5x an fp32 model's bytes) and the embedding is its fp32 one.
// Loaded from a folder (load), the matmul weights exist only as the copies, and so does an
// embedding the folder stores in bf16 (its lookup widens the rows exactly; a tied one reads the
// lm_head's copy): a bf16 folder costs its own bytes, not 3x them. The MoE experts' stacked
// weights get bf16 copies too and their GEMMs the same rounding (ops/moe.h); routers compute in
// fp32 in either dtype.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/models/causal_lm.h"

namespace titan {

class InferenceWeights {
 public:
  // dtype f32 or bf16 (else titan::Error). The model must outlive this object.
  InferenceWeights(const CausalLM& model, DType dtype);
  // The model folder `dir` (config.json and its weights, checked and loaded as load_hf_model
  // does, with its errors) for inference in `dtype`, owning its model. Under bf16 each matmul
  // weight, and an embedding stored in bf16, goes from the folder straight into its copy
  // (load_hf_model_bf16_only) and is never held in fp32: a bf16 folder's bits as stored, an fp32
  // one's rounded as the copies of a live model are -- the same weights, and the same logits, as
  // InferenceWeights(load_hf_model(dir), bf16).
  // `adapter`: a PEFT LoRA adapter folder merged into the weights at load (models/peft_adapter.h;
  // the model's fp32 weights are then held, and under bf16 rounded into the copies), or empty.
  static std::unique_ptr<InferenceWeights> load(const std::string& dir, DType dtype,
                                                bool allow_nonfinite = false,
                                                const std::string& adapter = "");

  const CausalLM& model() const { return model_; }
  DType dtype() const { return dtype_; }
  // The model's modules, each linear pointing at its bf16 copy when dtype is bf16.
  const DecoderModules& modules() const { return modules_; }
  size_t copy_bytes() const { return copies_.bytes(); }  // 0 for f32
  // Floats of the largest bf16 weight a linear kernel without bf16 operands (an [overrides] one)
  // widens to fp32; 0 for f32 weights or when every kernel takes bf16.
  int64_t widened_floats() const { return widened_floats_; }

 private:
  // Lays out the bf16 copies (dtype bf16) and points modules_ at them -- the embedding's too when
  // `embedding_in_bf16` (a tied one shares the lm_head's); `fill`: rounds the model's fp32
  // masters into them.
  InferenceWeights(const CausalLM& model, DType dtype, bool fill, bool embedding_in_bf16);
  // fn(master, copy, numel) for every bf16 copy: the matmul weights, the stacked experts, then an
  // untied embedding's.
  template <typename Fn>
  void for_each_copy(const Fn& fn);

  std::unique_ptr<CausalLM> owned_;  // load's model (model_ then refers to it)
  const CausalLM& model_;
  DType dtype_;
  Buffer copies_;  // the bf16 copies, one allocation
  DecoderModules modules_;
  int64_t widened_floats_ = 0;
};

// The weight dtype `titan generate --dtype` names: "auto" (or empty) is the model folder's
// dtype as Transformers' torch_dtype="auto" takes it -- config.json's dtype / torch_dtype, else
// the stored embedding's -- with float16 folders run with fp32 weights (no fp16 path); "bfloat16"
// / "bf16" and "float32" / "fp32" force one. Anything else is a titan::Error.
DType inference_dtype(const std::string& model_dir, const std::string& requested);

}  // namespace titan
