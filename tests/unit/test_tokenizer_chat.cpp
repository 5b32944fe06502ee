// The chat templates against transformers' apply_chat_template (tokenize=False), byte for byte, for
// every official template in tests/fixtures/chat_templates.json; how a folder's template is found
// and recognised; and the post-processor's BOS against Hugging Face tokenizers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "test_tokenizer_python.h"
#include "titan/core/error.h"
#include "titan/data/chat_template.h"
#include "titan/data/tokenizer.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixtures_dir() {
  return test::env_or_empty("TITAN_SOURCE_DIR") + "/tests/fixtures";
}

std::string llama3_style_tokenizer_dir() {
  return fixtures_dir() + "/llama3-style-tokenizer";
}

struct Fixture {
  std::string kind, name, bos_token, chat_template;
};

const std::vector<Fixture>& fixtures() {
  static const std::vector<Fixture> all = [] {
    std::ifstream in(fixtures_dir() + "/chat_templates.json");
    EXPECT_TRUE(in.good()) << "no tests/fixtures/chat_templates.json";
    std::vector<Fixture> out;
    for (const json& f : json::parse(in)) {
      out.push_back({f["kind"], f["name"], f["bos_token"].is_null() ? "" : f["bos_token"],
                     f["chat_template"]});
    }
    return out;
  }();
  return all;
}

ChatTemplateKind kind_of(const std::string& kind) {
  if (kind == "qwen3") return ChatTemplateKind::qwen3;
  if (kind == "qwen2_5") return ChatTemplateKind::qwen2_5;
  if (kind == "llama3") return ChatTemplateKind::llama3;
  if (kind == "llama3_1") return ChatTemplateKind::llama3_1;
  EXPECT_EQ(kind, "llama3_2");
  return ChatTemplateKind::llama3_2;
}

// A folder Transformers can load: the Llama-3-style tokenizer.json (rendering with tokenize=False
// does not depend on it) and a tokenizer_config.json holding the template, or chat_template.jinja
// holding it instead when `jinja` is given (then written byte for byte); removed with the object.
std::unique_ptr<test::ScratchDir> template_folder(const std::string& name, const Fixture& f,
                                                  const std::string* jinja) {
  auto folder = std::make_unique<test::ScratchDir>("chat_" + name);
  const fs::path& dir = folder->path();
  fs::copy_file(llama3_style_tokenizer_dir() + "/tokenizer.json", dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  json config = {{"eos_token", "<|eot_id|>"},
                 {"bos_token", f.bos_token.empty() ? json() : json(f.bos_token)}};
  if (jinja) {
    std::ofstream(dir / "chat_template.jinja", std::ios::binary) << *jinja;
  } else {
    config["chat_template"] = f.chat_template;
  }
  std::ofstream(dir / "tokenizer_config.json") << config.dump(2);
  return folder;
}

std::string load_error(const fs::path& dir) {
  try {
    ChatTemplate::load(dir.string());
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    return message;
  }
  ADD_FAILURE() << dir << ": loaded";
  return "";
}

using Conversation = std::vector<ChatMessage>;

// Conversations every template renders: no tool turns, no reasoning_content.
std::vector<Conversation> common_conversations() {
  return {
      {{"user", "Hi", ""}},
      {{"system", "You are a helpful assistant.", ""}, {"user", "What is 2+2?", ""}},
      {{"system", "Be brief.", ""},
       {"user", "Hello", ""},
       {"assistant", "Hi! How can I help?", ""},
       {"user", "Tell me a joke.", ""}},
      // Unicode, and whitespace Jinja's trim (Python's str.strip) removes: NBSP, ideographic space,
      // U+001F (Python's isspace, not Unicode White_Space); U+200B is not whitespace.
      {{"system", "\t Sys \n", ""},
       {"user", "  \xE5\xA4\x9A\xE8\xAF\xAD\xE8\xA8\x80 <b>text</b>\n\n\x1f", ""},
       {"assistant", "\xC2\xA0 spaced reply \xE3\x80\x80\n", ""},
       {"user", "\xE2\x80\x8Bzero width\xE2\x80\x8B", ""}},
      // Empty contents.
      {{"system", "", ""}, {"user", "", ""}, {"assistant", "", ""}, {"user", "again", ""}},
      // A second system message, and a conversation opened by the assistant.
      {{"system", "s1", ""}, {"user", "u", ""}, {"system", "s2", ""}, {"user", "u2", ""}},
      {{"assistant", "I start.", ""}, {"user", "ok", ""}},
      {{"user", "\xF0\x9F\x99\x82 emoji and <|im_end|> as text", ""}},
  };
}

// Conversations only the Qwen templates render: tool turns, and (Qwen3) reasoning.
std::vector<Conversation> qwen_conversations(bool qwen3) {
  std::vector<Conversation> out = {
      {{"system", "sys", ""},
       {"user", "Weather?", ""},
       {"assistant", "Calling.", ""},
       {"tool", "{\"t\": 21}", ""},
       {"tool", "{\"h\": 40}", ""},
       {"assistant", "It is 21 degrees.", ""}},
  };
  if (!qwen3) return out;
  const std::vector<Conversation> thinking = {
      // Reasoning inside content, split at </think>; earlier turns lose their thinking.
      {{"user", "Q1", ""},
       {"assistant", "<think>\nfirst thoughts\n</think>\n\nA1", ""},
       {"user", "Q2", ""},
       {"assistant", "<think>\n\nsecond\n\n</think>\n\n\nA2", ""}},
      // Reasoning given separately.
      {{"user", "Why?", ""}, {"assistant", "Because.", "Let me think.\n"}},
      // Assistant turns after the last user query (tool round trips) keep their reasoning.
      {{"system", "sys", ""},
       {"user", "Weather?", ""},
       {"assistant", "Calling.", "need a tool"},
       {"tool", "{\"t\": 21}", ""},
       {"assistant", "It is 21 degrees.", ""}},
      // A user message that is a wrapped tool response does not count as a query.
      {{"user", "go", ""},
       {"assistant", "x", "r1"},
       {"user", "<tool_response>\nok\n</tool_response>", ""},
       {"assistant", "done", ""}},
      // No reasoning on a final turn still gets an empty think block; "</think>" alone.
      {{"user", "a", ""}, {"assistant", "plain answer", ""}},
      {{"user", "a", ""}, {"assistant", "partial</think>answer", ""}},
  };
  out.insert(out.end(), thinking.begin(), thinking.end());
  return out;
}

json to_json(const Conversation& messages) {
  json out = json::array();
  for (const ChatMessage& m : messages) {
    json msg = {{"role", m.role}, {"content", m.content}};
    if (!m.reasoning_content.empty()) msg["reasoning_content"] = m.reasoning_content;
    out.push_back(msg);
  }
  return out;
}

struct RenderCase {
  ChatTemplate chat;
  Conversation messages;
  bool add_generation_prompt, enable_thinking;
  json request;
};

TEST(ChatTemplate, MatchesTransformersForEveryOfficialTemplate) {
  std::vector<RenderCase> cases;
  std::vector<std::unique_ptr<test::ScratchDir>> folders;
  const auto add_folder = [&](std::unique_ptr<test::ScratchDir> folder, const Fixture& f) {
    const fs::path dir = folder->path();
    folders.push_back(std::move(folder));
    const ChatTemplate loaded = ChatTemplate::load(dir.string());
    EXPECT_EQ(loaded.kind(), kind_of(f.kind)) << f.name;
    std::vector<Conversation> conversations = common_conversations();
    if (f.kind == "qwen3" || f.kind == "qwen2_5") {
      for (const Conversation& c : qwen_conversations(f.kind == "qwen3"))
        conversations.push_back(c);
    }
    for (const Conversation& messages : conversations) {
      for (bool gen : {false, true}) {
        for (bool thinking : {true, false}) {
          RenderCase c{loaded, messages, gen, thinking, {}};
          c.request = {{"dir", dir.string()},
                       {"messages", to_json(messages)},
                       {"add_generation_prompt", gen},
                       {"enable_thinking", thinking}};
          // Llama 3.2's default date is today's; pass one (3.1 keeps its own default).
          if (f.kind == "llama3_2" || (f.kind == "llama3_1" && gen)) {
            c.chat.date_string = "05 Mar 2025";
            c.request["date_string"] = "05 Mar 2025";
          }
          cases.push_back(c);
        }
      }
    }
  };
  for (size_t i = 0; i < fixtures().size(); ++i) {
    const Fixture& f = fixtures()[i];
    add_folder(template_folder(f.kind + std::to_string(i), f, nullptr), f);
  }
  // chat_template.jinja in place of the config entry, with CRLF line ends and a final newline:
  // Jinja reads it as the same template, and so does titan.
  const Fixture& llama3 = fixtures()[3];
  ASSERT_EQ(llama3.kind, "llama3");
  std::string crlf;
  for (const char ch : fixtures()[4].chat_template)
    crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
  add_folder(template_folder("jinja_crlf", fixtures()[4], &crlf), fixtures()[4]);
  const std::string with_newline = llama3.chat_template + "\n";
  add_folder(template_folder("jinja_newline", llama3, &with_newline), llama3);

  json request = json::array();
  for (const RenderCase& c : cases) request.push_back(c.request);
  const json expected = test::run_reference("chat_template_reference.py", {}, request);
  ASSERT_TRUE(expected.is_array());
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const RenderCase& c = cases[i];
    EXPECT_EQ(c.chat.render(c.messages, c.add_generation_prompt, c.enable_thinking),
              expected[i].get<std::string>())
        << c.chat.name() << ", case " << i << ": " << c.request.dump();
  }
}

TEST(ChatTemplate, Llama32DefaultDateIsTodays) {
  const Fixture& f = fixtures()[5];
  ASSERT_EQ(f.kind, "llama3_2");
  const auto folder = template_folder("llama32_today", f, nullptr);
  const fs::path& dir = folder->path();
  const Conversation messages = {{"user", "What day is it?", ""}};
  const json expected = test::run_reference("chat_template_reference.py", {},
                                            json::array({{{"dir", dir.string()},
                                                          {"messages", to_json(messages)},
                                                          {"add_generation_prompt", true},
                                                          {"enable_thinking", true}}}));
  ASSERT_EQ(expected.size(), 1u);
  // Both read the local date; they can differ only across midnight.
  EXPECT_EQ(ChatTemplate::load(dir.string()).render(messages, true, true), expected[0]);
}

TEST(ChatTemplate, SpecExampleIds) {
  const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  const ChatTemplate chat = ChatTemplate::load(test::qwen3_tokenizer_dir());
  ASSERT_EQ(chat.kind(), ChatTemplateKind::qwen3);
  const std::string text = chat.render({{"user", "Hi", ""}}, true, false);
  EXPECT_EQ(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(tok.encode(text), (std::vector<int32_t>{151644, 872, 198, 13048, 151645, 198, 151644,
                                                    77091, 198, 151667, 271, 151668, 271}));
}

TEST(ChatTemplate, FindsTheTemplateAsAutoTokenizerDoes) {
  const Fixture& llama3 = fixtures()[3];
  const Fixture& qwen25 = fixtures()[2];
  // chat_template.jinja wins over tokenizer_config.json's entry.
  auto folder = template_folder("precedence", qwen25, nullptr);
  fs::path dir = folder->path();
  std::ofstream(dir / "chat_template.jinja") << llama3.chat_template;
  EXPECT_EQ(ChatTemplate::load(dir.string()).kind(), ChatTemplateKind::llama3);
  // A tokenizer.json path means its folder.
  EXPECT_EQ(ChatTemplate::load((dir / "tokenizer.json").string()).kind(), ChatTemplateKind::llama3);
  // additional_chat_templates/ without chat_template.jinja leaves no default.
  fs::remove(dir / "chat_template.jinja");
  fs::create_directories(dir / "additional_chat_templates");
  std::ofstream(dir / "additional_chat_templates" / "tool_use.jinja") << llama3.chat_template;
  EXPECT_NE(load_error(dir).find("leaves no default chat template"), std::string::npos);

  // A list of named templates: the "default" one.
  folder = template_folder("named", qwen25, nullptr);
  dir = folder->path();
  json config = {
      {"chat_template", json::array({{{"name", "tool_use"}, {"template", "x"}},
                                     {{"name", "default"}, {"template", qwen25.chat_template}}})}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  EXPECT_EQ(ChatTemplate::load(dir.string()).kind(), ChatTemplateKind::qwen2_5);
  config["chat_template"].erase(1);
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  EXPECT_NE(load_error(dir).find("none named \"default\""), std::string::npos);
}

TEST(ChatTemplate, RefusesTemplatesItDoesNotRender) {
  Fixture edited = fixtures()[2];
  edited.chat_template.insert(edited.chat_template.find("You are Qwen"), " ");
  const auto folder = template_folder("edited", edited, nullptr);
  const fs::path& dir = folder->path();
  const std::string message = load_error(dir);
  EXPECT_NE(message.find((dir / "tokenizer_config.json").string() +
                         ": not a chat template titan renders"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Qwen3, Qwen2.5 Instruct, Llama 3, 3.1 and 3.2 Instruct"),
            std::string::npos);
  EXPECT_NE(message.find("raw prompts"), std::string::npos);
  std::ofstream(dir / "chat_template.jinja") << "{{ messages }}";
  EXPECT_NE(load_error(dir).find("chat_template.jinja: not a chat template titan renders"),
            std::string::npos);

  const test::ScratchDir no_template("no_template");
  std::ofstream(no_template / "tokenizer_config.json") << "{\"eos_token\": \"x\"}";
  EXPECT_NE(load_error(no_template.path()).find("no chat template"), std::string::npos);
}

TEST(ChatTemplate, RefusesWhatATemplateCannotRender) {
  const ChatTemplate qwen3(ChatTemplateKind::qwen3);
  const ChatTemplate qwen25(ChatTemplateKind::qwen2_5);
  const ChatTemplate llama31(ChatTemplateKind::llama3_1, "<|begin_of_text|>");
  EXPECT_THROW(qwen3.render({{"robot", "x", ""}}, false, true), Error);
  EXPECT_THROW(qwen3.render({}, true, true), Error);
  EXPECT_THROW(llama31.render({}, true, true), Error);
  EXPECT_THROW(llama31.render({{"user", "q", ""}, {"tool", "{}", ""}}, false, true), Error);
  EXPECT_THROW(qwen25.render({{"user", "q", ""}, {"assistant", "a", "why"}}, false, true), Error);
  EXPECT_THROW(ChatTemplate(ChatTemplateKind::llama3).render({{"user", "q", ""}}, false, true),
               Error);
  EXPECT_TRUE(qwen3.has_thinking_switch());
  EXPECT_FALSE(llama31.has_thinking_switch());
}

TEST(TokenizerSpecialTokens, MatchHuggingFaceOnALlama3StyleTokenizer) {
  const std::string dir = llama3_style_tokenizer_dir();
  const Tokenizer tok = Tokenizer::load(dir);
  const ChatTemplate chat = ChatTemplate::load(dir);
  ASSERT_EQ(chat.kind(), ChatTemplateKind::llama3_1);
  const std::vector<std::string> texts = {
      "Hello there!", "", "The capital of France is Paris.\n\n  indented",
      "<|begin_of_text|>already", "\xE5\xA4\x9A\xE8\xAF\xAD\xE8\xA8\x80 1234567 \xF0\x9F\x99\x82"};
  const std::vector<Conversation> chats = {{{"user", "Hello, how are you?", ""}},
                                           {{"system", "You are a helpful assistant.", ""},
                                            {"user", "What is the capital of France?", ""},
                                            {"assistant", "The capital of France is Paris.", ""},
                                            {"user", "Thanks!", ""}}};
  json request = {{"texts", texts}, {"chats", json::array()}};
  for (const Conversation& c : chats) request["chats"].push_back(to_json(c));
  const json expected = test::run_reference("tokenizer_special_reference.py", {dir}, request);
  ASSERT_TRUE(expected.is_object());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tok.encode_with_special_tokens(texts[i]),
              expected["with_special"][i].get<std::vector<int32_t>>())
        << texts[i];
    EXPECT_EQ(tok.encode(texts[i]), expected["without_special"][i].get<std::vector<int32_t>>())
        << texts[i];
  }
  const int32_t bos = tok.token_to_id("<|begin_of_text|>");
  ASSERT_GE(bos, 0);
  EXPECT_EQ(tok.encode_with_special_tokens("Hello").front(), bos);
  // A rendered chat holds its BOS and is encoded without the post-processor: one BOS, as
  // apply_chat_template(tokenize=True) gives.
  for (size_t i = 0; i < chats.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(chat.render(chats[i], true, true));
    EXPECT_EQ(ids, expected["chat_ids"][i].get<std::vector<int32_t>>()) << i;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1);
  }
}

TEST(TokenizerSpecialTokens, QwenAddsNone) {
  const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  for (const char* text : {"Hello there!", "", "<|im_start|>x"}) {
    EXPECT_EQ(tok.encode_with_special_tokens(text), tok.encode(text)) << text;
  }
}

}  // namespace
}  // namespace titan
