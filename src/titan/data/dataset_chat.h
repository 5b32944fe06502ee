// Chat data for fine-tuning: a conversation rendered with the Qwen3 chat template, tokenized as
// one text (the ids the model sees at inference), with labels only on what the assistant says.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/data/chat_template.h"
#include "titan/data/tokenizer.h"

namespace titan {

inline constexpr int32_t kIgnoreLabel = -100;

// ids: the tokens of apply_qwen3_chat_template(messages) (no generation prompt). labels: the same
// ids on every assistant reply (from after "<|im_start|>assistant\n" through its "<|im_end|>",
// so the model learns to stop) and kIgnoreLabel everywhere else: system, user and tool turns,
// the role headers and the newline after each turn. A token that starts inside a header is a
// header token. The tokenizer must have <|im_start|> and <|im_end|> (titan::Error otherwise).
void encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                 std::vector<int32_t>& ids, std::vector<int32_t>& labels);

}  // namespace titan
