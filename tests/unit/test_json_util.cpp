// The JSON helpers every input goes through: the depth limit at parse, and error text that quotes
// a value by its start only, however large or deep the value is.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_dataset_util.h"
#include "titan/io/json_util.h"

namespace titan {
namespace {

using nlohmann::json;

TEST(JsonUtil, DepthLimitCountsLevelsBelowTheTop) {
  EXPECT_EQ(parse_json_strict("[[[1]]]", "f", "x", 3), json::parse("[[[1]]]"));
  EXPECT_EQ(test::error_of([] { parse_json_strict("[[[[1]]]]", "f", "x", 3); }),
            "f: x nests deeper than 3 levels");
  // Far past the limit: refused as soon as the limit is passed, no recursion on the rest.
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  EXPECT_EQ(test::error_of([&] { parse_json_strict(deep, "f", "x", 128); }),
            "f: x nests deeper than 128 levels");
  EXPECT_EQ(test::error_of([] { parse_json_strict("{\"a\":1,\"a\":2}", "f", "x", 3); }),
            "f: x has the key \"a\" twice");
}

TEST(JsonUtil, ParseErrorsAreOneShortLine) {
  const std::string unterminated = "\"" + std::string(100'000, 'x');
  const std::string e = test::error_of([&] { parse_json_strict(unterminated, "f", "x", 3); });
  EXPECT_EQ(e.rfind("f: x is not valid JSON: ", 0), 0u) << e;
  EXPECT_LE(e.size(), 250u) << e;
  EXPECT_TRUE(e.ends_with("...")) << e;
}

TEST(JsonUtil, ExcerptShowsTheStartOfAValue) {
  EXPECT_EQ(json_excerpt(json(-1)), "-1");
  EXPECT_EQ(json_excerpt(json("a\nb")), "\"a\\nb\"");
  EXPECT_EQ(json_excerpt(json::parse("[1,[2,{\"k\":null}]]")), "array [1,[2,{\"k\":null}]]");
  EXPECT_EQ(json_excerpt(json(std::string(1000, 'y'))),
            "\"" + std::string(kJsonExcerptChars - 1, 'y') + "...");
  // Wide and deep values: only the first characters are ever written.
  json wide = json::array();
  std::string wide_text = "[";
  for (int i = 0; i < 100'000; ++i) {
    wide.push_back(0);
    wide_text += i ? ",0" : "0";
  }
  EXPECT_EQ(json_excerpt(wide), "array " + wide_text.substr(0, kJsonExcerptChars) + "...");
  json deep = 0;
  for (int i = 0; i < 100; ++i) deep = json::array({deep});
  EXPECT_EQ(json_excerpt(deep), "array " + std::string(kJsonExcerptChars, '[') + "...");
}

TEST(JsonUtil, QuoteCutsLongNames) {
  EXPECT_EQ(json_quote("model.norm.weight"), "\"model.norm.weight\"");
  const std::string q = json_quote(std::string(10'000, 'n'));
  EXPECT_EQ(q, "\"" + std::string(kJsonQuoteBytes, 'n') + "\"...");
}

}  // namespace
}  // namespace titan
