#include "titan/data/chat_template.h"

#include <string_view>

#include "titan/core/error.h"

namespace titan {
namespace {

// Python's str.lstrip('\n'), rstrip('\n') and strip('\n').
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view strip_newlines(std::string_view s) {
  return rstrip_newlines(lstrip_newlines(s));
}

bool is_tool_response(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

// The template's last_query_index: the last user message that is not a wrapped tool response.
size_t last_query_index(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) return i;
  }
  return messages.size() - 1;
}

// after_query: the turn follows the last user query; only such turns keep their thinking, and the
// final one always gets a think block (possibly empty).
void append_assistant(std::string& out, const ChatMessage& m, bool after_query, bool is_last) {
  std::string_view content = m.content;
  std::string_view reasoning = m.reasoning_content;
  // Without reasoning_content, the reasoning is what precedes the first </think> (after the last
  // <think> there) and the content what follows the last </think>.
  const size_t close = content.rfind("</think>");
  if (reasoning.empty() && close != std::string_view::npos) {
    std::string_view before = rstrip_newlines(content.substr(0, content.find("</think>")));
    const size_t open = before.rfind("<think>");
    if (open != std::string_view::npos) before.remove_prefix(open + 7);
    reasoning = lstrip_newlines(before);
    content = lstrip_newlines(content.substr(close + 8));
  }
  out += "<|im_start|>assistant\n";
  if (after_query && (is_last || !reasoning.empty())) {
    out += "<think>\n";
    out += strip_newlines(reasoning);
    out += "\n</think>\n\n";
    out += lstrip_newlines(content);
  } else {
    out += content;
  }
  out += "<|im_end|>\n";
}

}  // namespace

std::string apply_qwen3_chat_template(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt, bool enable_thinking) {
  TITAN_CHECK(!messages.empty(), "chat template: no messages");
  std::string out;
  if (messages[0].role == "system") {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  const size_t last_query = last_query_index(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      append_assistant(out, m, i > last_query, i + 1 == messages.size());
    } else if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else if (m.role != "system") {
      fail("chat template: message ", i, " has unknown role \"", m.role,
           "\" (expected system, user, assistant or tool)");
    }
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace titan
