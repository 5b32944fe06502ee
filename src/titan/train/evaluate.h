// Loss and perplexity of a model over a data loader's batches, without gradients: the validation
// pass of `titan train` and the whole of `titan eval`, so both report the same numbers.
#pragma once

#include <cstdint>

#include "titan/data/loader.h"
#include "titan/models/causal_lm.h"

namespace titan {

struct EvalResult {
  double loss = 0.0;   // mean over scored tokens
  int64_t tokens = 0;  // scored tokens
  int64_t batches = 0;
};

// Up to max_batches batches (-1: until the loader ends). No scored token at all is an error.
EvalResult evaluate(CausalLM& model, DataLoader& loader, int64_t max_batches);

}  // namespace titan
