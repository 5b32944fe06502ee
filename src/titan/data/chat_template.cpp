// Rendering: each official template's output for messages without tools, as its Jinja computes it
// (ChatML for Qwen, header/eot turns for Llama 3).
#include "titan/data/chat_template.h"

#include <cstdint>
#include <ctime>
#include <string_view>

#include "titan/core/error.h"
#include "titan/data/utf8.h"

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

// Python's str.isspace(), which Jinja's trim filter (str.strip()) strips.
bool python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Jinja's trim: Python's str.strip() on the decoded text. Bytes that are not well-formed UTF-8
// are not whitespace.
std::string_view python_strip(std::string_view s) {
  size_t len = 0;
  while (!s.empty() && utf8_valid_length(s, 0) > 0 && python_space(utf8_decode_valid(s, 0, &len))) {
    s.remove_prefix(len);
  }
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80 && s.size() - start < 4) {
      --start;
    }
    if (utf8_valid_length(s, start) != s.size() - start ||
        !python_space(utf8_decode_valid(s, start, &len))) {
      break;
    }
    s.remove_suffix(len);
  }
  return s;
}

void check_role(const ChatMessage& m, size_t i, bool tool_allowed, std::string_view name) {
  if (m.role == "system" || m.role == "user" || m.role == "assistant") return;
  if (m.role == "tool") {
    TITAN_CHECK(tool_allowed, "chat template: message ", i, " is a tool turn, which titan renders ",
                "only for the Qwen templates, not ", name);
    return;
  }
  fail("chat template: message ", i, " has unknown role \"", m.role,
       "\" (expected system, user, assistant or tool)");
}

// Consecutive tool results share one user turn (both Qwen templates).
void append_tool_response(std::string& out, const std::vector<ChatMessage>& messages, size_t i) {
  if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
}

std::string render_qwen3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         bool enable_thinking) {
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
      append_tool_response(out, messages, i);
    }
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// Qwen2.5 Instruct: ChatML with a default system message.
std::string render_qwen2_5(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<|im_start|>system\n";
  out += messages[0].role == "system"
             ? messages[0].content
             : std::string("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  out += "<|im_end|>\n";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      append_tool_response(out, messages, i);
    } else if (m.role != "system" || i > 0) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

void append_llama_turn(std::string& out, std::string_view role, std::string_view content) {
  out += "<|start_header_id|>";
  out += role;
  out += "<|end_header_id|>\n\n";
  out += python_strip(content);
  out += "<|eot_id|>";
}

// transformers' strftime_now("%d %b %Y"): the local date, English month (the C locale).
std::string today_date_string() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%d %b %Y", &local);
  return std::string(buf, n);
}

// Llama 3 Instruct: every turn trimmed, bos_token before the first.
std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& bos) {
  std::string out = bos;
  for (const ChatMessage& m : messages) append_llama_turn(out, m.role, m.content);
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Llama 3.1 / 3.2 Instruct without tools: a system turn always, with the knowledge and today's
// dates before the (trimmed) system message.
std::string render_llama3_1(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                            const std::string& bos, const std::string& date) {
  std::string out = bos + "<|start_header_id|>system<|end_header_id|>\n\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n";
  const bool has_system = messages[0].role == "system";
  if (has_system) out += python_strip(messages[0].content);
  out += "<|eot_id|>";
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    append_llama_turn(out, messages[i].role, messages[i].content);
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(ChatTemplateKind kind, std::string bos_token)
    : kind_(kind), bos_token_(std::move(bos_token)) {}

std::string_view ChatTemplate::name() const {
  switch (kind_) {
    case ChatTemplateKind::qwen3:
      return "Qwen3";
    case ChatTemplateKind::qwen2_5:
      return "Qwen2.5 Instruct";
    case ChatTemplateKind::llama3:
      return "Llama 3 Instruct";
    case ChatTemplateKind::llama3_1:
      return "Llama 3.1 Instruct";
    case ChatTemplateKind::llama3_2:
      return "Llama 3.2 Instruct";
  }
  return "?";
}

ChatTurnMarkers ChatTemplate::turn_markers() const {
  if (kind_ == ChatTemplateKind::qwen3 || kind_ == ChatTemplateKind::qwen2_5) {
    return {"<|im_start|>", "\n", "assistant\n", "<|im_end|>"};
  }
  return {"<|start_header_id|>", "<|end_header_id|>\n\n", "assistant<|end_header_id|>\n\n",
          "<|eot_id|>"};
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, bool enable_thinking) const {
  TITAN_CHECK(!messages.empty(), "chat template: no messages");
  const bool qwen = kind_ == ChatTemplateKind::qwen3 || kind_ == ChatTemplateKind::qwen2_5;
  for (size_t i = 0; i < messages.size(); ++i) {
    check_role(messages[i], i, qwen, name());
    TITAN_CHECK(messages[i].reasoning_content.empty() || kind_ == ChatTemplateKind::qwen3,
                "chat template: message ", i, " has reasoning_content, which the ", name(),
                " template does not render (only Qwen3's does)");
  }
  if (!qwen) {
    TITAN_CHECK(!bos_token_.empty(), "chat template: the ", name(),
                " template opens with bos_token, but tokenizer_config.json has none");
  }
  switch (kind_) {
    case ChatTemplateKind::qwen3:
      return render_qwen3(messages, add_generation_prompt, enable_thinking);
    case ChatTemplateKind::qwen2_5:
      return render_qwen2_5(messages, add_generation_prompt);
    case ChatTemplateKind::llama3:
      return render_llama3(messages, add_generation_prompt, bos_token_);
    case ChatTemplateKind::llama3_1:
      return render_llama3_1(messages, add_generation_prompt, bos_token_,
                             date_string.empty() ? "26 Jul 2024" : date_string);
    case ChatTemplateKind::llama3_2:
      return render_llama3_1(messages, add_generation_prompt, bos_token_,
                             date_string.empty() ? today_date_string() : date_string);
  }
  fail("chat template: unknown kind");
}

}  // namespace titan
