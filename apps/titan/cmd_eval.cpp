#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "model_folder.h"
#include "titan/backend/cpu/threads.h"
#include "titan/data/chat_template.h"
#include "titan/data/dataset_chat.h"
#include "titan/data/dataset_tokenize.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/infer/device.h"
#include "titan/infer/weights.h"
#include "titan/models/causal_lm.h"
#include "titan/models/forward_only_model.h"
#include "titan/train/evaluate.h"

namespace titan::cli {
namespace {

// Text data too short for one batch of rows: how many tokens it holds and the --seq-len that fits
// (rows are never padded: each scores seq-len targets of a packed window, as training's do).
void explain_short_data(const Tokenizer& tokenizer, const LoaderOptions& options) {
  const int64_t held = count_packed_tokens(tokenizer, options.data);
  const int64_t window = options.seq_len + 1, rows = options.batch_size;
  if (held >= rows * window) return;  // not the reason
  const int64_t fits = held / rows - 1;
  if (fits >= 1) {
    fail("the data holds ", held,
         " tokens (an EOS after each document included), fewer than one "
         "batch of ",
         rows, " row(s) of --seq-len + 1 = ", window, " tokens: pass --seq-len ", fits, " or less",
         rows > 1 ? " (or a smaller --batch-size)" : "");
  }
  fail("the data holds ", held, " tokens (an EOS after each document included), too few for ", rows,
       " row(s) of at least 2 tokens: ", rows > 1 ? "pass --batch-size 1 and " : "",
       "give more text");
}

}  // namespace

Action add_eval_command(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("eval", "loss and perplexity of a Hugging Face model folder on a dataset");
  static std::string model_dir, text_field = "text", dtype = "auto", adapter, device = "cpu";
  static std::vector<std::string> data;
  static int64_t seq_len = 2048, batch_size = 1, max_batches = -1;
  static int threads;
  static bool allow_nonfinite = false, chat = false, truncate_long = false, packing = false;
  add_threads_option(*command, threads);
  command
      ->add_option("--model", model_dir,
                   "model folder (config.json, weights, tokenizer), or a titan step-N checkpoint")
      ->required();
  command->add_option("--adapter", adapter,
                      "a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) "
                      "merged into the model's weights at load");
  command->add_option("--data", data, "dataset files, folders or globs")->required();
  command->add_option("--text-field", text_field, "JSON field holding the text")
      ->capture_default_str();
  command->add_flag("--chat", chat,
                    "the data is conversations (\"messages\"), as training.dataset = \"chat\" "
                    "reads them: rendered with the model folder's chat template, one per row, "
                    "scored on the assistant replies only");
  command
      ->add_flag("--truncate-long-conversations", truncate_long,
                 "with --chat: cut a conversation longer than seq-len + 1 tokens instead of "
                 "stopping at it")
      ->needs("--chat");
  command
      ->add_flag("--packing", packing,
                 "with --chat: whole conversations packed into rows while they fit, as "
                 "training.dataset_packing packs them (TRL's packing): attention kept inside each "
                 "conversation, positions restarting at each; the same loss as one per row")
      ->needs("--chat");
  command
      ->add_option("--seq-len", seq_len,
                   "inputs per row, as torchtitan's training.seq_len: each row scores seq-len "
                   "targets from a window of seq-len + 1 tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--batch-size", batch_size, "rows per batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--max-batches", max_batches, "stop after this many batches (-1: all)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "-1") return {};
            char* end = nullptr;
            errno = 0;
            const long long n = std::strtoll(value.c_str(), &end, 10);
            if (errno == 0 && end != value.c_str() && *end == '\0' && n >= 1) return {};
            return "must be -1 (all batches) or a positive number of batches, not '" + value + "'";
          },
          "-1|N>0"))
      ->capture_default_str();
  command
      ->add_option("--dtype", dtype,
                   "matmuls: auto (bf16 for a bf16 folder, like Transformers' "
                   "torch_dtype=\"auto\"), bfloat16 (bf16 operands, fp32 accumulation, as "
                   "mixed-precision training) or float32")
      ->capture_default_str();
  command->add_flag("--allow-nonfinite-weights", allow_nonfinite,
                    "load weights holding NaN or Inf (refused otherwise; for debugging)");
  command
      ->add_option("--device", device,
                   "cpu, cuda or cuda:N (a build with -DTITAN_CUDA=ON; dense models)")
      ->capture_default_str();
  return [] {
    set_thread_count(threads);
    const ModelFolder folder(model_dir, "--model");  // a step-N checkpoint: read through its export
    // After the export (on the host: its loader writes the groups in place), before the model.
    select_inference_device(device);
    const std::string& folder_path = folder.path();
    check_inference_on_device(device, folder_path, adapter);
    const Tokenizer tokenizer = Tokenizer::load(folder_path);
    // Chat data's template first: a folder without one fails before the model is loaded.
    std::optional<ChatTemplate> chat_template;
    if (chat) {
      chat_template = ChatTemplate::load(folder_path);
      check_chat_tokenizer(tokenizer, *chat_template);
    }
    const DType compute = inference_dtype(folder_path, dtype);  // a bad --dtype fails first
    std::unique_ptr<CausalLM> model =
        load_forward_only_model(folder_path, compute, allow_nonfinite, adapter);
    // Said from the loaded model, not the flag: what its matmuls will compute in.
    std::fprintf(stderr, "precision: %s\n", describe_compute_dtype(model->compute_dtype()));
    LoaderOptions options;
    options.data.paths = data;
    options.data.text_field = text_field;
    options.batch_size = batch_size;
    options.seq_len = seq_len;
    options.shuffle = false;
    options.epochs = 1;
    if (chat) {
      options.mode = DataMode::chat;
      options.chat_template = chat_template;
      options.truncate_long = truncate_long;
      options.pack_conversations = packing;
      options.long_conversation_hint =
          "raise --seq-len, or pass --truncate-long-conversations to cut it";
    }
    DataLoader loader(options, tokenizer);
    EvalResult r;
    try {
      r = evaluate(*model, loader, max_batches);
    } catch (const Error&) {
      if (!chat) explain_short_data(tokenizer, options);
      throw;
    }
    if (chat) {
      std::printf(
          "loss %.6f  perplexity %.4f  (%lld assistant tokens scored in %lld batches of %lld "
          "rows; a row is %s %lld tokens, padded, rendered with the %s "
          "chat template)\n",
          r.loss, std::exp(r.loss), static_cast<long long>(r.tokens),
          static_cast<long long>(r.batches), static_cast<long long>(batch_size),
          packing ? "whole conversations packed into" : "one conversation of at most",
          static_cast<long long>(seq_len + 1), std::string(options.chat_template->name()).c_str());
      return 0;
    }
    std::printf(
        "loss %.6f  perplexity %.4f  (%lld tokens scored in %lld batches of %lld rows; a row is "
        "%lld inputs and %lld targets, a window of %lld tokens, as torchtitan's seq_len)\n",
        r.loss, std::exp(r.loss), static_cast<long long>(r.tokens),
        static_cast<long long>(r.batches), static_cast<long long>(batch_size),
        static_cast<long long>(seq_len), static_cast<long long>(seq_len),
        static_cast<long long>(seq_len + 1));
    return 0;
  };
}

}  // namespace titan::cli
