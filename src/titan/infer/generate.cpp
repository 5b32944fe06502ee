#include "titan/infer/generate.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "titan/core/error.h"
#include "titan/infer/session.h"
#include "titan/infer/text_stream.h"
#include "titan/io/json_util.h"
#include "titan/models/hf_config.h"

namespace titan {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prefill chunk of a PromptCache's session: a later turn's new tokens go through the GEMMs this
// many at a time, whatever the first turn's prompt length was.
constexpr int64_t kPromptCacheChunk = 512;

// The session for this call and how many leading prompt tokens its cache already holds: with a
// cache, the longest prefix shared with cache->ids (at most n_prompt - 1: the last prompt token
// is always fed, for its logits); without, a new session of its own in `own`.
InferenceSession& session_for(const InferenceWeights& weights, const std::vector<int32_t>& prompt,
                              int64_t needed, DType kv_dtype, PromptCache* cache,
                              std::unique_ptr<InferenceSession>& own, int64_t& reused) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  reused = 0;
  if (cache == nullptr) {
    own = std::make_unique<InferenceSession>(weights, needed, n_prompt, kv_dtype);
    return *own;
  }
  TITAN_CHECK(cache->session == nullptr || &cache->session->weights() == &weights,
              "a prompt cache was used with other weights than it was made for");
  TITAN_CHECK(cache->session == nullptr || cache->session->cache().dtype() == kv_dtype,
              "a prompt cache was used with another KV cache dtype than it was made for");
  if (cache->session == nullptr || cache->session->max_len() < needed) {
    const int64_t len = std::min(weights.model().args().max_position_embeddings, 2 * needed);
    cache->session.reset();  // its cache is freed before the larger one is allocated
    cache->ids.clear();
    cache->session = std::make_unique<InferenceSession>(
        weights, len, std::min(len, std::max(n_prompt, kPromptCacheChunk)), kv_dtype);
  }
  const size_t limit = std::min(cache->ids.size(), prompt.size() - 1);
  while (static_cast<size_t>(reused) < limit && cache->ids[reused] == prompt[reused]) ++reused;
  cache->session->truncate(reused);
  return *cache->session;
}

}  // namespace

GenerateOptions generation_defaults(const std::string& model_dir, const ModelArgs& args) {
  GenerateOptions o;
  o.eos_ids = args.eos_token_ids;
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return o;
  const GenerationConfig g = read_hf_generation_config(path);
  if (!g.eos_token_ids.empty()) o.eos_ids = g.eos_token_ids;
  o.sampling.do_sample = g.do_sample;
  o.sampling.temperature = g.temperature;
  o.sampling.top_k = g.top_k;
  o.sampling.top_p = g.top_p;
  // Fields GenerationConfig does not carry.
  const nlohmann::json j = read_json_file(path, "generation_config.json", 4);
  const auto number = [&](const char* key, double fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    TITAN_CHECK(j[key].is_number(), path, ": ", key, " must be a number");
    return j[key].get<double>();
  };
  o.sampling.min_p = number("min_p", o.sampling.min_p);
  o.sampling.repetition_penalty = number("repetition_penalty", o.sampling.repetition_penalty);
  if (j.contains("max_new_tokens") && j["max_new_tokens"].is_number_integer()) {
    o.max_new_tokens = j["max_new_tokens"].get<int64_t>();
  }
  try {
    validate_sampling_params(o.sampling);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
  return o;
}

void check_generate_request(const ModelArgs& args, int64_t prompt_tokens, int64_t max_new_tokens) {
  const int64_t max_pos = args.max_position_embeddings;
  TITAN_CHECK(prompt_tokens > 0, "the prompt is empty (it encodes to no tokens)");
  TITAN_CHECK(prompt_tokens <= max_pos, "the prompt has ", prompt_tokens,
              " tokens, more than the model's max_position_embeddings (", max_pos, ")");
  TITAN_CHECK(max_new_tokens >= 1, "max_new_tokens must be at least 1, got ", max_new_tokens);
  TITAN_CHECK(max_new_tokens <= max_pos - prompt_tokens, "prompt (", prompt_tokens,
              " tokens) + max_new_tokens (", max_new_tokens,
              ") does not fit the KV cache: the model's max_position_embeddings is ", max_pos,
              " (use --max-new-tokens ", max_pos - prompt_tokens, " or less)");
}

GenerateResult generate_tokens(const InferenceWeights& weights, const std::vector<int32_t>& prompt,
                               const GenerateOptions& options,
                               const std::function<bool(int32_t)>& on_token, PromptCache* cache) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const ModelArgs& args = weights.model().args();
  check_generate_request(args, n_prompt, options.max_new_tokens);
  Sampler sampler(options.sampling, options.seed);
  const auto t0 = std::chrono::steady_clock::now();
  // The last token is never fed back, but the cache is sized for all of them (one shape).
  std::unique_ptr<InferenceSession> own;
  GenerateResult r;
  InferenceSession& session =
      session_for(weights, prompt, n_prompt + options.max_new_tokens, options.kv_cache_dtype, cache,
                  own, r.cached_prompt_tokens);
  try {
    const int64_t vocab = args.vocab_size;
    std::vector<int32_t> context = prompt;  // the repetition penalty sees prompt and output
    context.reserve(static_cast<size_t>(n_prompt + options.max_new_tokens));
    r.prompt_tokens = n_prompt;
    r.finish_reason = "length";
    float* logits = nullptr;
    for (int64_t pos = r.cached_prompt_tokens; pos < n_prompt;) {
      const int64_t n = std::min(session.max_chunk(), n_prompt - pos);
      logits = session.forward(prompt.data() + pos, n);
      pos += n;
    }
    r.prefill_seconds = seconds_since(t0);
    for (int64_t step = 0; step < options.max_new_tokens; ++step) {
      if (step > 0) logits = session.forward(&r.ids.back(), 1);
      const int32_t id = sampler.next(logits, vocab, context);
      if (step == 0) r.time_to_first_token = seconds_since(t0);
      r.ids.push_back(id);
      context.push_back(id);
      const bool eos =
          std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end();
      if (on_token && !on_token(id)) {
        r.finish_reason = "stop";
        break;
      }
      if (eos) {
        r.finish_reason = "eos";
        break;
      }
    }
    r.decode_seconds = seconds_since(t0) - r.time_to_first_token;
    if (cache != nullptr) {  // the prompt and every generated id but the last are in the cache
      cache->ids.assign(prompt.begin(), prompt.end());
      cache->ids.insert(cache->ids.end(), r.ids.begin(), r.ids.end() - 1);
    }
  } catch (...) {
    if (cache != nullptr) {
      session.truncate(0);
      cache->ids.clear();
    }
    throw;
  }
  return r;
}

GenerateResult generate_text(const InferenceWeights& weights, const Tokenizer& tokenizer,
                             const std::vector<int32_t>& prompt, const GenerateOptions& options,
                             const std::function<void(std::string_view)>& on_text,
                             PromptCache* cache) {
  TextStream stream(tokenizer, options.stop);
  const auto emit = [&](const std::string& piece) {
    if (!piece.empty() && on_text) on_text(piece);
  };
  GenerateResult r = generate_tokens(
      weights, prompt, options,
      [&](int32_t id) {
        emit(stream.push(id));
        return !stream.stopped();
      },
      cache);
  emit(stream.finish());
  r.text = stream.text();
  return r;
}

}  // namespace titan
