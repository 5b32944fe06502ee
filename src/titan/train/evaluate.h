// Loss and perplexity of a model over a data loader's batches, without gradients: the validation
// pass of `titan train` and the whole of `titan eval`, so both report the same numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "titan/data/loader.h"
#include "titan/models/causal_lm.h"

namespace titan {

// The model folder `dir` for titan eval, its matmuls computing in `compute` (f32 or bf16), with
// load_hf_model's checks and errors; only ever run forward (CausalLM::set_forward_only: what a
// backward would need is not kept). Under bf16 it holds each
// matmul weight only as the bf16 copy the forward reads (CausalLM::hold_compute_copies), loaded
// from the folder as load_hf_model_bf16_only does -- a bf16 folder's bits as stored, an fp32
// one's rounded as a live model's copies are -- and so does an embedding the folder stores in
// bf16: the same loss as load_hf_model(dir, bf16)'s forward, bit for bit, at the folder's bytes
// rather than twice them in fp32 masters.
// `adapter`, a PEFT LoRA adapter folder, or empty: merged into the weights at load
// (models/peft_adapter.h), the model then holding fp32 masters under bf16 too.
std::unique_ptr<CausalLM> load_eval_model(const std::string& dir, DType compute,
                                          bool allow_nonfinite = false,
                                          const std::string& adapter = "");

struct EvalResult {
  double loss = 0.0;   // mean over scored tokens
  int64_t tokens = 0;  // scored tokens
  int64_t batches = 0;
};

// Up to max_batches batches (-1: until the loader ends). No scored token at all is an error.
EvalResult evaluate(CausalLM& model, DataLoader& loader, int64_t max_batches);

}  // namespace titan
