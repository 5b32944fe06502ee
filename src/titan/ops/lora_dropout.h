// LoRA's dropout (PEFT's lora_dropout: base(x) + B(A(dropout(x))) * scaling), inverted dropout on
// the adapter's input only, with masks that are never stored: each element's keep/drop is a
// counter-based hash of where it is, so the backward draws the same mask again, and every
// data-parallel layout, accumulation split or resumed run draws the same masks as one process.
//
// The formula (tests/reference/lora_dropout_reference.py computes it too), mix64 being
// core/rng.h's and fnv1a_hash the module's name hashed:
//   module = mix64(seed ^ fnv1a_hash("model.layers.3.self_attn.q_proj"))
//   call   = mix64(module ^ step)                    step: the optimizer step, 1-based
//   token  = mix64(mix64(call ^ row) ^ position)     row: in the step's whole global batch
//   keep(feature) = (mix64(token ^ feature) >> 11) * 2^-53 >= p
// and a kept element is multiplied by the fp32 1 / (1 - p), a dropped one is 0. The step's global
// batch's rows are numbered micro-batch by micro-batch (micro-batch i of the step, over all
// ranks, holds rows [i B, (i + 1) B)), so a row's number is the same on any layout.
#pragma once

#include <cstdint>

namespace titan {

struct LoraDropoutCall {
  double p = 0.0;         // the drop probability, in (0, 1)
  uint64_t key = 0;       // mix64(mix64(seed ^ fnv1a_hash(module)) ^ step)
  int64_t first_row = 0;  // the global row of the call's token 0
  int64_t seq_len = 0;    // tokens per row: token t is row first_row + t / seq_len
  // The whole input's feature of the call's feature 0: under tensor parallel a row-wise linear's
  // input holds the rank's columns, masked as one process masks them.
  int64_t first_feature = 0;
};

// Whether `feature` of the token at (row, position) is kept.
bool lora_dropout_keeps(const LoraDropoutCall& call, int64_t row, int64_t position,
                        int64_t feature);

// dst (N, features) = x (N, features) with the call's mask applied and the kept values scaled by
// 1 / (1 - p), or dst += that when `accumulate` (the backward's dx: the mask's own transpose).
// dst may be x (not when accumulating).
void lora_dropout_apply(float* dst, const float* x, int64_t n, int64_t features,
                        const LoraDropoutCall& call, bool accumulate);

}  // namespace titan
