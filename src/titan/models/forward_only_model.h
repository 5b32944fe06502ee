// A model folder loaded to run forward only -- what `titan eval` evaluates and `titan generate`
// decodes with (infer/weights.h) -- so both hold the same weights the same way.
#pragma once

#include <memory>
#include <string>

#include "titan/models/causal_lm.h"

namespace titan {

// The model folder `dir`, its matmuls computing in `compute` (f32 or bf16), with load_hf_model's
// checks and errors; only ever run forward (CausalLM::set_forward_only: what a backward would need
// is not kept). Under bf16 it holds each matmul weight only as the bf16 copy the forward reads
// (CausalLM::hold_compute_copies), loaded from the folder as load_hf_model_bf16_only does -- a
// bf16 folder's bits as stored, an fp32 one's rounded as a live model's copies are -- and so does
// an embedding the folder stores in bf16: the same loss as load_hf_model(dir, bf16)'s forward, bit
// for bit, at the folder's bytes rather than twice them in fp32 masters.
// `adapter`, a PEFT LoRA adapter folder, or empty: merged into the weights at load
// (models/peft_adapter.h), the model then holding fp32 masters under bf16 too.
std::unique_ptr<CausalLM> load_forward_only_model(const std::string& dir, DType compute,
                                                  bool allow_nonfinite = false,
                                                  const std::string& adapter = "");

// Rounds the fp32 master of `model`'s parameter `param` into `copy`, as the model's own copies are
// made (to nearest even).
void round_from_master(const CausalLM& model, const std::string& param, uint16_t* copy);

// Under bf16 compute: makes `model`'s bf16 copies its weights (CausalLM::hold_compute_copies),
// each rounded once from its fp32 master -- a live model, or one loaded with masters (an adapter
// merged), run forward only.
void hold_copies_from_masters(CausalLM& model);

}  // namespace titan
