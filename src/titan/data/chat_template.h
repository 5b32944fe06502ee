// Chat templates written out in C++ instead of run by a Jinja engine. A model folder's template is
// recognised by its exact text among the official ones titan renders (chat_template_load.cpp):
// Qwen3 (hybrid thinking), Qwen2.5 Instruct, Llama 3 Instruct, Llama 3.1 Instruct and Llama 3.2
// Instruct. Any other template is refused by name, never approximated. Output equals transformers'
// apply_chat_template(messages, tokenize=False, ...) for messages without tools.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace titan {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool" (tool: Qwen templates only)
  std::string content;
  std::string reasoning_content;  // Qwen3 assistant turns only; empty = absent (then taken from
                                  // <think> in content)
};

enum class ChatTemplateKind { qwen3, qwen2_5, llama3, llama3_1, llama3_2 };

// The texts that delimit a rendered turn, for finding the assistant replies in token space.
struct ChatTurnMarkers {
  std::string_view turn_start;        // a special token opening every turn ("<|im_start|>")
  std::string_view header_end;        // the header ends with the first occurrence of this
  std::string_view assistant_header;  // the whole header of an assistant turn
  std::string_view turn_end;          // a special token closing every turn ("<|im_end|>")
};

// Every turn marker of every template titan renders: message text holding one would forge a turn.
inline constexpr std::string_view kChatTurnMarkerTokens[] = {
    "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};

class ChatTemplate {
 public:
  // The template Hugging Face's AutoTokenizer uses for a folder (a model folder, or the folder of
  // a tokenizer.json path): chat_template.jinja when present (additional_chat_templates/ without
  // it leaves no default, which is refused), else tokenizer_config.json's "chat_template" (a
  // string, or the entry named "default" of a list). bos_token comes from tokenizer_config.json.
  // An unknown template, or none, is a titan::Error of one line naming the file.
  static ChatTemplate load(const std::string& dir_or_json_path);

  // A known template directly (tests; folders whose tokenizer titan trained). bos_token is the
  // text the Llama templates open with (tokenizer_config.json's bos_token).
  explicit ChatTemplate(ChatTemplateKind kind, std::string bos_token = "");

  // add_generation_prompt appends the assistant header. enable_thinking is Qwen3's switch: false
  // appends an empty think block after the generation prompt, so the model answers without
  // reasoning; the other templates have no such switch and ignore it, as their Jinja does
  // (callers that let a user ask for it should refuse it: has_thinking_switch()). Errors: an empty
  // list, an unknown role, a "tool" turn or reasoning_content where the template has none, a Llama
  // template without a bos_token.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     bool enable_thinking) const;

  ChatTemplateKind kind() const { return kind_; }
  // "Qwen3", "Qwen2.5 Instruct", "Llama 3 Instruct", "Llama 3.1 Instruct", "Llama 3.2 Instruct".
  std::string_view name() const;
  bool has_thinking_switch() const { return kind_ == ChatTemplateKind::qwen3; }
  ChatTurnMarkers turn_markers() const;

  // Llama 3.1/3.2's "Today Date:" (the template's date_string). Empty: the template's default,
  // "26 Jul 2024" for 3.1 and, for 3.2, today's local date as "%d %b %Y" (transformers'
  // strftime_now). Ignored by the other templates.
  std::string date_string;

 private:
  ChatTemplateKind kind_;
  std::string bos_token_;
};

}  // namespace titan
