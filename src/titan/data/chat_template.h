// The Qwen3 chat template (ChatML with thinking blocks), written out in C++ instead of run by a
// Jinja engine. Output equals transformers' apply_chat_template(messages, tokenize=False, ...) with
// the hybrid-thinking Qwen3 tokenizer_config.json template, for messages without tools.
#pragma once

#include <string>
#include <vector>

namespace titan {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::string
      reasoning_content;  // assistant only; empty = absent (then taken from <think> in content)
};

// add_generation_prompt appends "<|im_start|>assistant\n"; with enable_thinking false it also
// appends an empty think block, so the model answers without reasoning. An empty list or an
// unknown role is a titan::Error (the Jinja template would silently drop the message).
std::string apply_qwen3_chat_template(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt, bool enable_thinking);

}  // namespace titan
