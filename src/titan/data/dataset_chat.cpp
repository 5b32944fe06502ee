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

void check_chat_tokenizer(const Tokenizer& tok, const ChatTemplate& chat) {
  const ChatTurnMarkers markers = chat.turn_markers();
  TITAN_CHECK(tok.token_to_id(markers.turn_start) >= 0 && tok.token_to_id(markers.turn_end) >= 0,
              "chat data with the ", chat.name(), " template needs a tokenizer with the ",
              markers.turn_start, " and ", markers.turn_end, " tokens");
}

void encode_chat(const Tokenizer& tok, const ChatTemplate& chat,
                 const std::vector<ChatMessage>& messages, std::vector<int32_t>& ids,
                 std::vector<int32_t>& labels) {
  check_chat_tokenizer(tok, chat);
  const ChatTurnMarkers markers = chat.turn_markers();
  const int32_t turn_start = tok.token_to_id(markers.turn_start);
  const int32_t turn_end = tok.token_to_id(markers.turn_end);
  const std::string text = chat.render(messages, false, true);
  // Turns are found in token space: every turn marker comes from the template (messages holding
  // one are refused when read), and the role headers are ASCII, which normalisation leaves
  // alone. So the split is exact without mapping token offsets back through NFC.
  ids = tok.encode(text, true);
  labels.assign(ids.size(), kIgnoreLabel);
  enum class State { outside, header, reply } state = State::outside;
  std::string header;  // bytes of the current role header so far
  for (size_t t = 0; t < ids.size(); ++t) {
    const int32_t id = ids[t];
    if (id == turn_start) {
      state = State::header;
      header.clear();
    } else if (state == State::header) {
      header += token_bytes(tok, id);
      // A reply begins after the header only for the assistant. (The header's last token may run
      // on into the reply when the reply starts with blank lines; it starts in the header, so it
      // stays unlabelled.)
      const size_t end = header.find(markers.header_end);
      if (end != std::string::npos) {
        const std::string_view whole(header.data(), end + markers.header_end.size());
        state = whole == markers.assistant_header ? State::reply : State::outside;
      }
    } else if (state == State::reply) {
      labels[t] = id;
      if (id == turn_end) state = State::outside;
    }
  }
}

}  // namespace titan
