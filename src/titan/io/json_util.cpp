#include "titan/io/json_util.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "titan/core/error.h"

namespace titan {

using json = nlohmann::json;

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
  }
}

json read_json_file(const std::string& path, std::string_view what, int max_depth) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in.good(), path, ": cannot open ", what);
  std::ostringstream text;
  text << in.rdbuf();
  TITAN_CHECK(!in.bad(), path, ": cannot read ", what);
  return parse_json_strict(text.str(), path, what, max_depth);
}

std::string json_quote(std::string_view s) {
  // Invalid UTF-8 would make dump() throw; replace it instead, this is only for messages.
  return json(std::string(s)).dump(-1, ' ', true, json::error_handler_t::replace);
}

std::string one_line(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  return out;
}

}  // namespace titan
