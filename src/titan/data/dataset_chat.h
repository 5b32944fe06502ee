// Chat data for fine-tuning: a conversation rendered with the model's chat template, tokenized as
// one text (the ids the model sees at inference), with labels only on what the assistant says.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/data/chat_template.h"
#include "titan/data/tokenizer.h"

namespace titan {

inline constexpr int32_t kIgnoreLabel = -100;

// ids: the tokens of chat.render(messages) (no generation prompt; the text is encoded without the
// post-processor's special tokens: the Llama templates hold their BOS). labels: the same ids on
// every assistant reply and kIgnoreLabel everywhere else: system, user and tool turns, the role
// headers and what separates turns. A reply runs from after its header through the token that
// closes the turn, which is labelled so the model learns to stop:
//   ChatML (Qwen):  <|im_start|>assistant\n | reply <|im_end|> | \n
//   Llama 3:        <|start_header_id|>assistant<|end_header_id|>\n\n | reply <|eot_id|>
// A token that starts inside a header is a header token. The tokenizer must have the template's
// turn tokens (titan::Error otherwise).
// The tokenizer has the template's turn tokens, which encode_chat finds the replies by; a
// titan::Error of one line otherwise.
void check_chat_tokenizer(const Tokenizer& tok, const ChatTemplate& chat);

void encode_chat(const Tokenizer& tok, const ChatTemplate& chat,
                 const std::vector<ChatMessage>& messages, std::vector<int32_t>& ids,
                 std::vector<int32_t>& labels);

}  // namespace titan
