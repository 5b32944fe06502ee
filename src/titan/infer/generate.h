// The generation loop: one prefill of the prompt, then one token per step against the static KV
// cache, each chosen by the sampler, until an eos id, a stop string or max_new_tokens. The eos
// token that ends a sequence is part of the output ids, as in Hugging Face generate().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/tokenizer.h"
#include "titan/infer/sampling.h"
#include "titan/infer/session.h"
#include "titan/infer/weights.h"

namespace titan {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<int64_t> eos_ids;
  std::vector<std::string> stop;      // text-level stop strings (generate_text only)
  DType kv_cache_dtype = DType::f32;  // f32 or bf16 (infer/kv_cache.h)
};

// Defaults as Transformers takes them from a model folder: generation_config.json's sampling
// fields (do_sample, temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens) and
// eos ids, falling back to config.json's eos ids and greedy decoding when the file is absent.
GenerateOptions generation_defaults(const std::string& model_dir, const ModelArgs& args);

struct GenerateResult {
  std::vector<int32_t> ids;   // generated ids only (an ending eos included)
  std::string text;           // generate_text: the released text (stop string excluded)
  std::string finish_reason;  // "eos", "stop" or "length"
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of those, taken from a PromptCache instead of prefilled
  double prefill_seconds = 0.0;      // the prompt's forward (of its uncached tokens)
  double time_to_first_token = 0.0;  // prefill and the first token's choice
  double decode_seconds = 0.0;       // every step after the first token
};

// Throws titan::Error, before anything is allocated, for an empty prompt, a prompt longer than
// the model's max positions, or a max_new_tokens below 1 or past the max positions.
void check_generate_request(const ModelArgs& args, int64_t prompt_tokens, int64_t max_new_tokens);

// What a conversation keeps between turns: a session and the ids its KV cache holds, in order.
// A chat re-renders the whole conversation through the template each turn; a call given this
// reuses the longest prefix the new prompt shares with `ids` and prefills only the rest (in
// chunks of the session's max_chunk). The session is made with room for twice the positions the
// call needs (prompt + max_new_tokens; at most the model's max positions), so the next turns fit,
// and made again the same way (everything prefilled anew) when a turn needs more than it has.
// Every call must pass the same weights. After an error the cache is emptied, still usable.
struct PromptCache {
  std::unique_ptr<InferenceSession> session;
  std::vector<int32_t> ids;
};

// Token level: on_token(id) sees each generated id and returns false to stop generation there
// (finish_reason "stop"). Without a cache the session is made for this call: the prompt in one
// forward, the KV cache sized prompt + max_new_tokens.
GenerateResult generate_tokens(const InferenceWeights& weights, const std::vector<int32_t>& prompt,
                               const GenerateOptions& options,
                               const std::function<bool(int32_t)>& on_token = {},
                               PromptCache* cache = nullptr);

// Text level: streams released text to on_text (complete UTF-8, never past a stop string).
GenerateResult generate_text(const InferenceWeights& weights, const Tokenizer& tokenizer,
                             const std::vector<int32_t>& prompt, const GenerateOptions& options,
                             const std::function<void(std::string_view)>& on_text = {},
                             PromptCache* cache = nullptr);

}  // namespace titan
