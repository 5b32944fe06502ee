#include "titan/data/dataset_chat.h"

#include <string>
#include <string_view>

#include "titan/core/error.h"
#include "titan/data/byte_level.h"

namespace titan {
namespace {

// The bytes a token stands for: its byte-level inverse, or (added tokens) its own text.
std::string token_bytes(const Tokenizer& tok, int32_t id) {
  const std::string token = tok.id_to_token(id);
  std::string raw;
  return byte_level_decode(token, raw) ? raw : token;
}

}  // namespace

void encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                 std::vector<int32_t>& ids, std::vector<int32_t>& labels) {
  const int32_t im_start = tok.token_to_id("<|im_start|>");
  const int32_t im_end = tok.token_to_id("<|im_end|>");
  TITAN_CHECK(im_start >= 0 && im_end >= 0,
              "chat data needs a tokenizer with the <|im_start|> and <|im_end|> tokens");
  const std::string text = apply_qwen3_chat_template(messages, false, true);
  // Turns are found in token space: every <|im_start|> and <|im_end|> comes from the template
  // (messages holding the markers are refused when read), and the role header after
  // <|im_start|> is ASCII, which normalisation leaves alone. So the split is exact without
  // mapping token offsets back through NFC.
  ids = tok.encode(text, true);
  labels.assign(ids.size(), kIgnoreLabel);
  constexpr std::string_view kHeader = "assistant\n";
  enum class State { outside, header, reply } state = State::outside;
  std::string header;  // bytes of the current role header so far
  for (size_t t = 0; t < ids.size(); ++t) {
    const int32_t id = ids[t];
    if (id == im_start) {
      state = State::header;
      header.clear();
    } else if (state == State::header) {
      header += token_bytes(tok, id);
      // The header ends with its newline; a reply begins after it only for the assistant. (The
      // newline's token may run on into the reply when the reply starts with blank lines; it
      // starts in the header, so it stays unlabelled.)
      if (header.find('\n') != std::string::npos) {
        state = header.starts_with(kHeader) ? State::reply : State::outside;
      }
    } else if (state == State::reply) {
      labels[t] = id;
      if (id == im_end) state = State::outside;
    }
  }
}

}  // namespace titan
