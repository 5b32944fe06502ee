// JSON helpers shared by the safetensors header, the shard index and config.json: strict
// parsing and one-line error text.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace titan {

// Parses `text`, refusing what nlohmann would accept silently: a key repeated in one object
// (nlohmann keeps the last) and nesting deeper than `max_depth` below the top value (which also
// bounds the work on hostile input). Errors name `file` and `what` ("safetensors header").
nlohmann::json parse_json_strict(std::string_view text, const std::string& file,
                                 std::string_view what, int max_depth);
// Reads and parses a whole JSON file the same way.
nlohmann::json read_json_file(const std::string& path, std::string_view what, int max_depth);

// `s` as a JSON string literal with non-ASCII and control characters escaped, so any name
// (even one holding a newline) prints on one line.
std::string json_quote(std::string_view s);
// `s` with control characters and non-ASCII bytes replaced by '?' (for library messages that may
// quote raw input bytes).
std::string one_line(std::string_view s);

}  // namespace titan
