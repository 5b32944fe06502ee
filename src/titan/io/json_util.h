// JSON helpers shared by every JSON input (config.json, tokenizer.json, dataset records, the
// safetensors header and index, checkpoint state): strict, depth-limited parsing and one-line,
// bounded error text.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace titan {

// Parses `text`, refusing what nlohmann would accept silently: a key repeated in one object
// (nlohmann keeps the last) and nesting deeper than `max_depth` below the top value. The depth
// limit is what keeps hostile input from crashing code downstream: copying, comparing or walking a
// parsed value recurses once per level. Errors name `file` and `what` ("safetensors header"), and
// running out of memory is one of them.
nlohmann::json parse_json_strict(std::string_view text, const std::string& file,
                                 std::string_view what, int max_depth);
// The depth limit for JSON that comes from outside titan and has no fixed schema depth: datasets,
// prompt files, tokenizer.json and tokenizer_config.json. It is serde_json's recursion limit, so
// any file Hugging Face tokenizers can read is read here; real files need a handful of levels.
inline constexpr int kMaxJsonDocumentDepth = 128;

// Reads and parses a whole JSON file the same way.
nlohmann::json read_json_file(const std::string& path, std::string_view what, int max_depth);

// How an error message shows a value from an input: its type and the start of its JSON text,
// at most kJsonExcerptChars characters ("..." marks a cut). Never the whole value, which may be
// huge or deeply nested; the text is written only as far as it is shown.
inline constexpr size_t kJsonExcerptChars = 40;
std::string json_excerpt(const nlohmann::json& v);

// `s` as a JSON string literal with non-ASCII and control characters escaped, so any name
// (even one holding a newline) prints on one line. Longer than kJsonQuoteBytes, only its start is
// quoted, followed by "...".
inline constexpr size_t kJsonQuoteBytes = 120;
std::string json_quote(std::string_view s);
// `s` with control characters and non-ASCII bytes replaced by '?' (for library messages that may
// quote raw input bytes), cut to `max_chars` with "..." .
std::string one_line(std::string_view s, size_t max_chars = 200);

}  // namespace titan
