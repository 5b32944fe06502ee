// titan generate: text from a Hugging Face model folder, streamed to stdout as it is produced.
//   --prompt TEXT            one completion (--chat wraps it in the model's chat template)
//   --prompts FILE           JSON Lines, {"prompt": ...} or {"messages": [...]} per line ->
//                            one JSON result per line on stdout, same order
//   (neither)                interactive chat on stdin: history kept (its KV cache too: a turn
//                            prefills only what it adds), /reset, Ctrl-D quits
// Sampling defaults come from the folder's generation_config.json, as in Transformers; flags
// override them and --greedy overrides do_sample. --dtype picks the weights' dtype (default:
// the folder's, like Transformers' torch_dtype="auto"; infer/weights.h): bf16 halves the bytes a
// decode step reads and the matmuls take bf16 operands with fp32 accumulation. --kv-cache-dtype
// picks the KV cache's (default: the weights', as torch keeps it; infer/kv_cache.h). Speed (prompt
// tokens/s, generated tokens/s, time to first token) goes to stderr so stdout stays the generated
// text. Chat uses the folder's chat template (data/chat_template.h: Qwen3, Qwen2.5, Llama 3/3.1/3.2
// Instruct), read only when a chat is rendered, so raw prompts work with any template. A raw
// prompt gets the tokenizer's special tokens as HF's tokenizer(prompt) does (Llama 3: BOS);
// rendered chat text does not (the template holds them).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "model_folder.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/data/chat_template.h"
#include "titan/data/tokenizer.h"
#include "titan/infer/device.h"
#include "titan/infer/generate.h"
#include "titan/infer/kv_cache.h"
#include "titan/infer/weights.h"
#include "titan/io/json_util.h"
#include "titan/models/causal_lm.h"
#include "titan/models/hf_checkpoint.h"

namespace titan::cli {
namespace {

using nlohmann::json;

struct GenerateFlags {
  std::string model, prompt, prompts, system, device = "cpu", dtype = "auto";
  std::string adapter;  // a PEFT LoRA adapter folder merged at load
  std::string kv_cache_dtype = "auto";
  bool prompt_given = false, chat = false, think = true, think_given = false, greedy = false;
  bool allow_nonfinite = false;
  std::optional<int64_t> max_new_tokens, top_k;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  int threads = 1;
};

GenerateOptions resolve_options(const GenerateFlags& f, const std::string& dir,
                                const ModelArgs& args, DType kv_cache) {
  GenerateOptions o = generation_defaults(dir, args);
  o.kv_cache_dtype = kv_cache;
  SamplingParams& s = o.sampling;
  // An explicit sampling flag means the user wants to sample, unless --greedy says otherwise.
  if (f.temperature || f.top_k || f.top_p || f.min_p) s.do_sample = true;
  if (f.temperature) s.temperature = *f.temperature;
  if (f.top_k) s.top_k = *f.top_k;
  if (f.top_p) s.top_p = *f.top_p;
  if (f.min_p) s.min_p = *f.min_p;
  if (f.repetition_penalty) s.repetition_penalty = *f.repetition_penalty;
  if (f.greedy) s.do_sample = false;
  if (f.max_new_tokens) o.max_new_tokens = *f.max_new_tokens;
  validate_sampling_params(s);
  o.seed = f.seed;
  o.stop = f.stop;
  return o;
}

// The folder's chat template, read on first use.
const ChatTemplate& chat_template(const GenerateFlags& f) {
  static std::optional<ChatTemplate> chat;
  if (!chat) {
    chat = ChatTemplate::load(f.model);
    TITAN_CHECK(!f.think_given || chat->has_thinking_switch(), "--think/--no-think: the ",
                chat->name(), " chat template of ", f.model,
                " has no thinking switch (only Qwen3's has)");
  }
  return *chat;
}

std::string render_chat(const std::vector<ChatMessage>& messages, const GenerateFlags& f) {
  std::vector<ChatMessage> all;
  if (!f.system.empty()) all.push_back({"system", f.system, ""});
  all.insert(all.end(), messages.begin(), messages.end());
  return chat_template(f).render(all, /*add_generation_prompt=*/true, f.think);
}

void print_stats(const GenerateResult& r) {
  const int64_t n = static_cast<int64_t>(r.ids.size());
  const int64_t prefilled = r.prompt_tokens - r.cached_prompt_tokens;
  const double prompt_rate = r.prefill_seconds > 0 ? prefilled / r.prefill_seconds : 0.0;
  const std::string cached = r.cached_prompt_tokens > 0
                                 ? " (" + std::to_string(r.cached_prompt_tokens) + " cached, " +
                                       std::to_string(prefilled) + " prefilled)"
                                 : "";
  // The first token's time is in the time to first token; the rate is over the ones after it.
  const double gen_rate = n > 1 && r.decode_seconds > 0 ? (n - 1) / r.decode_seconds : 0.0;
  std::fprintf(stderr,
               "generate: prompt %lld tokens%s at %.1f tokens/s | generated %lld tokens at %.1f "
               "tokens/s | time to first token %.1f ms | finish: %s\n",
               static_cast<long long>(r.prompt_tokens), cached.c_str(), prompt_rate,
               static_cast<long long>(n), gen_rate, r.time_to_first_token * 1e3,
               r.finish_reason.c_str());
}

void stream_out(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

struct BatchItem {
  std::string text;  // the prompt as the model sees it
  bool rendered;     // a rendered chat (holds its special tokens) rather than a raw prompt
};

// One JSON Lines record; errors name FILE:LINE.
BatchItem parse_batch_line(const std::string& line, const std::string& where,
                           const GenerateFlags& f) {
  json j = parse_json_strict(line, where, "the record", kMaxJsonDocumentDepth);
  TITAN_CHECK(j.is_object(), where, ": expected an object with \"prompt\" or \"messages\"");
  TITAN_CHECK(!(j.contains("messages") && j.contains("prompt")), where,
              ": the record has both \"prompt\" and \"messages\"; give one (a raw prompt, or a "
              "chat rendered with the folder's template)");
  if (j.contains("messages")) {
    TITAN_CHECK(j["messages"].is_array(), where, ": \"messages\" must be a list");
    std::vector<ChatMessage> messages;
    for (const json& m : j["messages"]) {
      TITAN_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                      m.contains("content") && m["content"].is_string(),
                  where, ": each message needs string \"role\" and \"content\"");
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>(), ""});
    }
    try {
      return {render_chat(messages, f), true};
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  TITAN_CHECK(j.contains("prompt") && j["prompt"].is_string(), where,
              ": expected a string \"prompt\" or a \"messages\" list");
  std::string prompt = j["prompt"].get<std::string>();
  // Not a ?: of two strings: GCC 12 then warns maybe-uninitialized once this is inlined.
  if (f.chat) prompt = render_chat({{"user", prompt, ""}}, f);
  return {std::move(prompt), f.chat};
}

int run_batch(const GenerateFlags& f, const InferenceWeights& weights, const Tokenizer& tok,
              const GenerateOptions& options) {
  std::ifstream in(f.prompts);
  TITAN_CHECK(in.good(), f.prompts, ": cannot open the prompts file");
  // Every line is checked before the first generation, so a bad line 900 costs nothing.
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = f.prompts + ":" + std::to_string(line_no);
    const BatchItem item = parse_batch_line(line, where, f);
    if (item.rendered) {
      prompts.push_back(tok.encode(item.text));
    } else {
      prompts.push_back(tok.encode_with_special_tokens(item.text));
    }
    try {
      check_generate_request(weights.model().args(), static_cast<int64_t>(prompts.back().size()),
                             options.max_new_tokens);
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  TITAN_CHECK(!prompts.empty(), f.prompts, ": no prompts");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerateResult r = generate_text(weights, tok, prompts[i], options);
    const json out = {{"index", i},
                      {"text", r.text},
                      {"ids", r.ids},
                      {"finish_reason", r.finish_reason},
                      {"prompt_tokens", r.prompt_tokens},
                      {"generated_tokens", r.ids.size()}};
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    std::fflush(stdout);
    print_stats(r);
  }
  return 0;
}

int run_interactive(const GenerateFlags& f, const InferenceWeights& weights, const Tokenizer& tok,
                    const GenerateOptions& options) {
  chat_template(f);  // a folder without a template titan renders stops here, not at every turn
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty)
    std::fprintf(stderr, "chat with %s (/reset clears the history, Ctrl-D quits)\n",
                 f.model.c_str());
  std::vector<ChatMessage> history;
  PromptCache cache;  // each turn prefills only what the rendered history adds
  std::string line;
  while (true) {
    if (tty) {
      std::fputs("> ", stderr);
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/reset") {
      history.clear();
      std::fputs("(history cleared)\n", stderr);
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    history.push_back({"user", line, ""});
    try {
      const std::vector<int32_t> prompt = tok.encode(render_chat(history, f));
      const GenerateResult r = generate_text(weights, tok, prompt, options, stream_out, &cache);
      stream_out("\n");
      history.push_back({"assistant", r.text, ""});
      print_stats(r);
    } catch (const Error& e) {
      // One bad turn (say, a history past the max positions) leaves the session usable.
      history.pop_back();
      std::fprintf(stderr, "titan generate: error: %s\n", e.what());
    }
  }
  if (tty) std::fputs("\n", stderr);
  return 0;
}

}  // namespace

Action add_generate_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "generate", "generate text from a Hugging Face model folder (streamed; chat; batch)");
  static GenerateFlags f;
  add_threads_option(*command, f.threads);
  command
      ->add_option("--model", f.model,
                   "model folder (config.json, weights, tokenizer), or a titan step-N checkpoint")
      ->required();
  auto* prompt = command->add_option("--prompt", f.prompt, "the prompt (--chat: the user turn)");
  command->add_option("--prompts", f.prompts, "JSON Lines file of {\"prompt\"} / {\"messages\"}")
      ->excludes(prompt);
  command->add_option("--adapter", f.adapter,
                      "a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) "
                      "merged into the model's weights at load");
  command->add_flag("--chat", f.chat, "apply the model's chat template to --prompt / \"prompt\"");
  command->add_option("--system", f.system, "system message for --chat and interactive chat");
  command->add_flag("--think,!--no-think", f.think,
                    "chat (Qwen3 only): let the model think first (default) or answer directly");
  command->add_option("--max-new-tokens", f.max_new_tokens,
                      "tokens to generate at most (default: generation_config.json, else 256)");
  command->add_flag("--greedy", f.greedy, "greedy decoding, whatever generation_config.json says");
  command->add_option("--temperature", f.temperature, "sampling temperature (0: greedy)");
  command->add_option("--top-k", f.top_k, "keep the k most likely tokens (0: off)");
  command->add_option("--top-p", f.top_p, "nucleus sampling mass (1: off)");
  command->add_option("--min-p", f.min_p, "drop tokens below min_p * the top probability");
  command->add_option("--repetition-penalty", f.repetition_penalty,
                      "HF repetition penalty (1: off)");
  command->add_option("--seed", f.seed, "sampling seed");
  command->add_option("--stop", f.stop, "stop when this text appears (repeatable; not printed)");
  command->add_option("--device", f.device,
                      "cpu, cuda or cuda:N (a build with -DTITAN_CUDA=ON; dense models)");
  command->add_option("--dtype", f.dtype,
                      "weights: auto (the folder's dtype), bfloat16 or float32; bf16 matmuls "
                      "take bf16 operands, fp32 accumulation");
  command->add_option("--kv-cache-dtype", f.kv_cache_dtype,
                      "KV cache: auto (the weights' dtype), bfloat16 or float32");
  command->add_flag("--allow-nonfinite-weights", f.allow_nonfinite,
                    "load weights holding NaN or Inf (refused otherwise; for debugging)");
  return [command] {
    f.prompt_given = command->count("--prompt") > 0;
    f.think_given = command->count("--think") > 0;  // either spelling
    set_thread_count(f.threads);
    // A step-N checkpoint is read through its export; every later read of f.model is of that.
    const ModelFolder folder(f.model, "--model");
    // After the export (on the host: its loader writes the groups in place), before the model.
    select_inference_device(f.device);
    f.model = folder.path();
    TITAN_CHECK(std::filesystem::is_directory(f.model), f.model, ": not a model folder");
    TITAN_CHECK(std::filesystem::exists(std::filesystem::path(f.model) / "tokenizer.json"), f.model,
                ": no tokenizer.json (generate needs the tokenizer files beside the ", "weights)");
    check_inference_on_device(f.device, f.model, f.adapter);
    const DType dtype = inference_dtype(f.model, f.dtype);  // a bad --dtype fails before loading
    const DType kv_cache = kv_cache_dtype(f.kv_cache_dtype, dtype);
    const Tokenizer tok = Tokenizer::load(f.model);
    const std::unique_ptr<InferenceWeights> loaded =
        InferenceWeights::load(f.model, dtype, f.allow_nonfinite, f.adapter);
    const InferenceWeights& weights = *loaded;
    const GenerateOptions options = resolve_options(f, f.model, weights.model().args(), kv_cache);
    if (!f.prompts.empty()) return run_batch(f, weights, tok, options);
    if (!f.prompt_given) return run_interactive(f, weights, tok, options);
    TITAN_CHECK(!f.prompt.empty(), "--prompt is empty");
    // Not a ?: of two vectors: GCC 12 then warns maybe-uninitialized (as for the strings above).
    std::vector<int32_t> ids;
    if (f.chat) {
      ids = tok.encode(render_chat({{"user", f.prompt, ""}}, f));
    } else {
      ids = tok.encode_with_special_tokens(f.prompt);
    }
    const GenerateResult r = generate_text(weights, tok, ids, options, stream_out);
    stream_out("\n");
    print_stats(r);
    return 0;
  };
}

}  // namespace titan::cli
