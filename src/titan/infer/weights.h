// The weights an InferenceSession reads: a model's module tree with its linear weights (q/k/v/o,
// gate/up/down, the experts, lm_head) in the model's compute dtype -- its fp32 parameters, or
// under bf16 its units' bf16 compute copies, the one copy of each weight a training or evaluation
// forward reads too, held as the weights (CausalLM::hold_compute_copies). Decode is bound by the
// bytes of weights read per token, so bf16 -- the copies rounded to nearest even, as torch's
// .to(torch.bfloat16) -- halves them, and with bf16 weights each matmul takes its input rounded to
// bf16 too (fp32 accumulation and outputs; bf16 GEMMs for a prompt, GEMVs widening in registers
// for one token), as mixed-precision training computes; norms, RoPE, attention, SwiGLU and the
// residual stream stay fp32 (the KV cache's dtype is the session's choice). The norms, biases and
// routers are read from the model's fp32 parameters. A live model keeps its fp32 masters beside
// the copies (1.5x an fp32 model's bytes); loaded from a folder (load: models/forward_only_model.h,
// what titan eval loads), the matmul weights exist only as the copies, and so does an embedding
// the folder stores in bf16 (its lookup widens the rows exactly; a tied one reads the lm_head's
// copy): a bf16 folder costs its own bytes, not 3x them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/models/causal_lm.h"

namespace titan {

class InferenceWeights {
 public:
  // The weights of `model` (which must outlive this object) in its compute dtype, f32 or bf16.
  // Under bf16 the model's copies become its weights, rounded here from its masters unless it
  // holds them already (a folder loaded for bf16); it refuses gradients from then on.
  explicit InferenceWeights(CausalLM& model);
  // The model folder `dir` for inference in `dtype` (f32 or bf16), owning its model:
  // load_forward_only_model's model, with its checks and errors -- under bf16 each matmul weight,
  // and an embedding stored in bf16, goes from the folder straight into its copy and is never held
  // in fp32: a bf16 folder's bits as stored, an fp32 one's rounded as the copies of a live model
  // are, so the same logits as InferenceWeights(*load_hf_model(dir, {}, false, bf16)).
  // `adapter`: a PEFT LoRA adapter folder merged into the weights at load (models/peft_adapter.h;
  // the model's fp32 weights are then held, and under bf16 rounded into the copies), or empty.
  static std::unique_ptr<InferenceWeights> load(const std::string& dir, DType dtype,
                                                bool allow_nonfinite = false,
                                                const std::string& adapter = "");

  const CausalLM& model() const { return model_; }
  DType dtype() const { return model_.compute_dtype(); }
  // The model's modules, each linear pointing at its bf16 copy when dtype is bf16.
  const DecoderModules& modules() const { return model_.modules(); }
  // Bytes of the bf16 copies the linears (and a bf16 lookup) read; 0 for f32.
  size_t copy_bytes() const { return copy_bytes_; }

 private:
  std::unique_ptr<CausalLM> owned_;  // load's model (model_ then refers to it)
  CausalLM& model_;
  size_t copy_bytes_ = 0;
};

// The weight dtype `titan generate --dtype` names: "auto" (or empty) is the model folder's
// dtype as Transformers' torch_dtype="auto" takes it -- config.json's dtype / torch_dtype, else
// the stored embedding's -- with float16 folders run with fp32 weights (no fp16 path); "bfloat16"
// / "bf16" and "float32" / "fp32" force one. Anything else is a titan::Error.
DType inference_dtype(const std::string& model_dir, const std::string& requested);

}  // namespace titan
