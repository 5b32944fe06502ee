// The Qwen3 chat template against transformers' apply_chat_template (tokenize=False).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_tokenizer_python.h"
#include "titan/core/error.h"
#include "titan/data/chat_template.h"
#include "titan/data/tokenizer.h"

namespace titan {
namespace {

using nlohmann::json;

struct ChatCase {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt, enable_thinking;
};

std::vector<ChatCase> chat_cases() {
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "Hi", ""}},
      {{"system", "You are a helpful assistant.", ""}, {"user", "What is 2+2?", ""}},
      {{"system", "Be brief.", ""},
       {"user", "Hello", ""},
       {"assistant", "Hi! How can I help?", ""},
       {"user", "Tell me a joke.", ""}},
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
       {"tool", "{\"h\": 40}", ""},
       {"assistant", "It is 21 degrees.", ""}},
      // A user message that is a wrapped tool response does not count as a query.
      {{"user", "go", ""},
       {"assistant", "x", "r1"},
       {"user", "<tool_response>\nok\n</tool_response>", ""},
       {"assistant", "done", ""}},
      // No reasoning on a final turn still gets an empty think block; "</think>" without "<think>".
      {{"user", "a", ""}, {"assistant", "plain answer", ""}},
      {{"user", "a", ""}, {"assistant", "partial</think>answer", ""}},
      {{"system", "s1", ""}, {"user", "u", ""}, {"system", "s2", ""}, {"user", "u2", ""}},
      {{"user", "多语言 <|im_end|> text\n\n", ""}},
  };
  std::vector<ChatCase> cases;
  for (const auto& messages : conversations) {
    for (bool gen : {false, true}) {
      for (bool thinking : {true, false}) cases.push_back({messages, gen, thinking});
    }
  }
  return cases;
}

TEST(ChatTemplate, MatchesTransformers) {
  const std::vector<ChatCase> cases = chat_cases();
  json request = json::array();
  for (const ChatCase& c : cases) {
    json messages = json::array();
    for (const ChatMessage& m : c.messages) {
      json msg = {{"role", m.role}, {"content", m.content}};
      if (!m.reasoning_content.empty()) msg["reasoning_content"] = m.reasoning_content;
      messages.push_back(msg);
    }
    request.push_back({{"messages", messages},
                       {"add_generation_prompt", c.add_generation_prompt},
                       {"enable_thinking", c.enable_thinking}});
  }
  const json expected =
      test::run_reference("tokenizer_chat_reference.py", {test::qwen3_tokenizer_dir()}, request);
  ASSERT_TRUE(expected.is_array());
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(apply_qwen3_chat_template(cases[i].messages, cases[i].add_generation_prompt,
                                        cases[i].enable_thinking),
              expected[i].get<std::string>())
        << "case " << i << ": " << request[i].dump();
  }
}

TEST(ChatTemplate, SpecExampleIds) {
  const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  const std::string text = apply_qwen3_chat_template({{"user", "Hi", ""}}, true, false);
  EXPECT_EQ(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(tok.encode(text), (std::vector<int32_t>{151644, 872, 198, 13048, 151645, 198, 151644,
                                                    77091, 198, 151667, 271, 151668, 271}));
}

TEST(ChatTemplate, RefusesUnknownRoleAndEmptyList) {
  EXPECT_THROW(apply_qwen3_chat_template({{"robot", "x", ""}}, false, true), Error);
  EXPECT_THROW(apply_qwen3_chat_template({}, true, true), Error);
}

}  // namespace
}  // namespace titan
