#include "titan/io/json_util.h"

#include <fstream>
#include <new>
#include <set>
#include <sstream>
#include <vector>

#include "titan/core/error.h"

namespace titan {

using json = nlohmann::json;

namespace {

std::string cut(std::string s, size_t max_chars) {
  if (s.size() > max_chars) {
    s.resize(max_chars);
    s += "...";
  }
  return s;
}

// Appends v's JSON text until `out` holds more than `limit` characters. Each level writes a
// bracket before it descends, so the recursion is no deeper than `limit` whatever v's depth.
void append_excerpt(const json& v, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  if (v.is_array() || v.is_object()) {
    out += v.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (!first) out += ',';
      first = false;
      if (v.is_object()) out += json_quote(it.key()) + ':';
      append_excerpt(*it, out, limit);
    }
    out += v.is_array() ? ']' : '}';
  } else if (v.is_string()) {
    out += json_quote(v.get_ref<const std::string&>());
  } else {
    out += v.dump();  // a number, boolean or null: short
  }
}

}  // namespace

json parse_json_strict(std::string_view text, const std::string& file, std::string_view what,
                       int max_depth) {
  std::vector<std::set<std::string>> open_objects;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    TITAN_CHECK(depth <= max_depth, file, ": ", what, " nests deeper than ", max_depth, " levels");
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      TITAN_CHECK(open_objects.back().insert(key).second, file, ": ", what, " has the key ",
                  json_quote(key), " twice");
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(file, ": ", what, " is not valid JSON: ", one_line(e.what()));
  } catch (const std::bad_alloc&) {
    fail(file, ": out of memory parsing the ", text.size(), " bytes of ", what);
  }
}

json read_json_file(const std::string& path, std::string_view what, int max_depth) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in.good(), path, ": cannot open ", what);
  std::ostringstream text;
  try {
    text << in.rdbuf();
  } catch (const std::bad_alloc&) {
    fail(path, ": out of memory reading ", what);
  }
  TITAN_CHECK(!in.bad(), path, ": cannot read ", what);
  return parse_json_strict(text.view(), path, what, max_depth);
}

std::string json_excerpt(const json& v) {
  std::string text;
  append_excerpt(v, text, kJsonExcerptChars);
  text = cut(std::move(text), kJsonExcerptChars);
  return v.is_array() || v.is_object() ? std::string(v.type_name()) + " " + text : text;
}

std::string json_quote(std::string_view s) {
  const bool long_name = s.size() > kJsonQuoteBytes;
  if (long_name) s = s.substr(0, kJsonQuoteBytes);
  // Invalid UTF-8 (a cut may make some) would make dump() throw; replace it, this is for messages.
  return json(std::string(s)).dump(-1, ' ', true, json::error_handler_t::replace) +
         (long_name ? "..." : "");
}

std::string one_line(std::string_view s, size_t max_chars) {
  std::string out(s.substr(0, max_chars + 1));
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  return cut(std::move(out), max_chars);
}

}  // namespace titan
