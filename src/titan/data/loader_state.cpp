#include "titan/data/loader_state.h"

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/io/json_util.h"

namespace titan {

using nlohmann::json;

namespace {
constexpr const char* kFormat = "titan-loader-state";
constexpr int kVersion = 1;
}  // namespace

std::string LoaderState::to_json() const {
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"epoch", epoch},
            {"file", file},
            {"doc", doc},
            {"doc_offset", doc_offset},
            {"carry", carry},
            {"batches", batches},
            {"skipped", skipped},
            {"truncated", truncated},
            {"mode", mode},
            // A string: JSON readers elsewhere may hold numbers as doubles (53-bit mantissa).
            {"seed", std::to_string(seed)},
            {"shuffle", shuffle},
            {"seq_len", seq_len},
            {"rank", rank},
            {"world_size", world_size},
            {"files_fingerprint", files_fingerprint}};
  return j.dump();
}

LoaderState LoaderState::from_json(const std::string& text) {
  const json j = parse_json_strict(text, "loader state", "the saved position", 4);
  TITAN_CHECK(j.is_object() && j.value("format", "") == kFormat,
              "loader state: not a titan loader state");
  TITAN_CHECK(j.value("version", 0) == kVersion, "loader state: version ", j.value("version", 0),
              " is not supported (only ", kVersion, ")");
  LoaderState s;
  try {
    s.epoch = j.at("epoch").get<int64_t>();
    s.file = j.at("file").get<int64_t>();
    s.doc = j.at("doc").get<int64_t>();
    s.doc_offset = j.at("doc_offset").get<int64_t>();
    s.carry = j.at("carry").get<std::vector<int32_t>>();
    s.batches = j.at("batches").get<int64_t>();
    s.skipped = j.at("skipped").get<int64_t>();
    s.truncated = j.at("truncated").get<int64_t>();
    s.mode = j.at("mode").get<std::string>();
    s.seed = std::stoull(j.at("seed").get<std::string>());
    s.shuffle = j.at("shuffle").get<bool>();
    s.seq_len = j.at("seq_len").get<int64_t>();
    s.rank = j.at("rank").get<int>();
    s.world_size = j.at("world_size").get<int>();
    s.files_fingerprint = j.at("files_fingerprint").get<std::string>();
  } catch (const std::exception& e) {
    fail("loader state: missing or malformed field (", e.what(), ")");
  }
  TITAN_CHECK(s.epoch >= 0 && s.file >= 0 && s.doc >= 0 && s.doc_offset >= 0 && s.batches >= 0,
              "loader state: negative position");
  return s;
}

}  // namespace titan
