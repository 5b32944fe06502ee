#include "titan/data/dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>

#include "titan/data/dataset_read.h"
#include "titan/data/utf8.h"
#include "titan/io/json_util.h"

namespace titan {

using nlohmann::json;

namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// The first bytes of a file, to tell token files (mapped, never read whole) from the rest.
std::string file_head(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in, path, ": cannot open");
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  head.resize(static_cast<size_t>(in.gcount()));
  return head;
}

// Lines that are not blank: one record each.
void split_lines(const std::string& bytes, std::vector<size_t>& begins, std::vector<size_t>& ends,
                 std::vector<size_t>& lines) {
  size_t line = 1;
  for (size_t pos = 0; pos < bytes.size(); ++line) {
    const void* nl = std::memchr(bytes.data() + pos, '\n', bytes.size() - pos);
    const size_t end = nl ? static_cast<const char*>(nl) - bytes.data() : bytes.size();
    if (!is_blank(std::string_view(bytes).substr(pos, end - pos))) {
      begins.push_back(pos);
      ends.push_back(end);
      lines.push_back(line);
    }
    pos = end + 1;
  }
}

ChatMessage parse_message(const json& m, const std::string& where, size_t index) {
  const auto bad = [&](const std::string& what) {
    throw BadRecordError(where + ": messages[" + std::to_string(index) + "] " + what);
  };
  if (!m.is_object()) bad("is not an object");
  ChatMessage message;
  for (const char* key : {"role", "content"}) {
    if (!m.contains(key) || !m[key].is_string()) bad(std::string("has no string \"") + key + "\"");
  }
  message.role = m["role"].get<std::string>();
  message.content = m["content"].get<std::string>();
  if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
    if (!m["reasoning_content"].is_string()) bad("has a non-string \"reasoning_content\"");
    message.reasoning_content = m["reasoning_content"].get<std::string>();
  }
  if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
      message.role != "tool") {
    bad("has role " + json_quote(message.role) + " (expected system, user, assistant or tool)");
  }
  // The loss mask finds turns by their markers (those of every template titan renders); a marker
  // inside a message would forge a turn (and is not text a model should learn to write).
  for (const std::string* text : {&message.content, &message.reasoning_content}) {
    for (const std::string_view marker : kChatTurnMarkerTokens) {
      if (text->find(marker) != std::string::npos) bad("contains " + std::string(marker));
    }
  }
  return message;
}

}  // namespace

bool is_token_file_path(const std::string& path) {
  return is_token_file(file_head(path, kTokenFileMagic.size()));
}

DocumentFile DocumentFile::open(const std::string& path, const DatasetOptions& options) {
  try {
    return read(path, options);
  } catch (const std::bad_alloc&) {
    fail(path, ": out of memory reading the file");
  }
}

DocumentFile DocumentFile::read(const std::string& path, const DatasetOptions& options) {
  DocumentFile f;
  f.path_ = path;
  f.options_ = options;
  if (is_token_file_path(path)) {
    f.format_ = Format::tokens;
    f.token_file_ = TokenFileReader::open(path);
    f.n_docs_ = f.token_file_->n_docs();
    return f;
  }
  f.bytes_ = read_data_file(path);
  TITAN_CHECK(!is_token_file(f.bytes_), path,
              ": a gzip-compressed token file (token files are mapped in place; gunzip it)");
  const std::string name = data_file_kind_name(path);
  const bool json_name = name.ends_with(".json");
  // c4's "*.json.gz" and torchtitan's c4_test "data.json" are JSON Lines: a .json file is a JSON
  // list only when it starts with '[', as Hugging Face datasets' json loader also decides.
  const size_t first = f.bytes_.find_first_not_of(" \t\r\n");
  if (json_name && first != std::string::npos && f.bytes_[first] == '[') {
    f.format_ = Format::json_array;
    // One level for the list, then the records' own.
    f.array_ = parse_json_strict(f.bytes_, path, "the JSON list", kMaxJsonDocumentDepth + 1);
    f.bytes_.clear();
    f.bytes_.shrink_to_fit();
    f.n_docs_ = f.array_.size();
    return f;
  }
  std::vector<size_t> begins, ends, lines;
  split_lines(f.bytes_, begins, ends, lines);
  if (json_name || name.ends_with(".jsonl") || name.ends_with(".ndjson")) {
    f.format_ = Format::json_lines;
    for (size_t i = 0; i < begins.size(); ++i) f.spans_.push_back({begins[i], ends[i], lines[i]});
  } else {
    // Paragraphs: runs of consecutive non-blank lines.
    f.format_ = Format::text;
    for (size_t i = 0; i < begins.size(); ++i) {
      if (i > 0 && lines[i] == lines[i - 1] + 1) {
        f.spans_.back().end = ends[i];
      } else {
        f.spans_.push_back({begins[i], ends[i], lines[i]});
      }
    }
  }
  f.n_docs_ = f.spans_.size();
  return f;
}

Record DocumentFile::record(size_t i, DataMode mode) const {
  try {
    return read_record(i, mode);
  } catch (const std::bad_alloc&) {
    fail(path_, ": out of memory reading document ", i);
  }
}

bool DocumentFile::has_messages(size_t i) const {
  switch (format_) {
    case Format::json_lines: {
      const Span& s = spans_[i];
      try {
        const json j = parse_json_strict(std::string_view(bytes_).substr(s.begin, s.end - s.begin),
                                         path_ + ":" + std::to_string(s.line), "the record",
                                         kMaxJsonDocumentDepth);
        return j.is_object() && j.contains("messages");
      } catch (const Error&) {
        return false;
      }
    }
    case Format::json_array:
      return array_[i].is_object() && array_[i].contains("messages");
    case Format::text:
    case Format::tokens:
      return false;
  }
  return false;
}

Record DocumentFile::read_record(size_t i, DataMode mode) const {
  switch (format_) {
    case Format::tokens: {
      TITAN_CHECK(mode == DataMode::pretrain, path_,
                  ": a token file has no chat messages (chat data must be JSON with \"messages\")");
      Record r;
      r.kind = Record::Kind::ids;
      r.where = path_ + ": document " + std::to_string(i);
      token_file_->read_doc(i, r.ids);
      return r;
    }
    case Format::text: {
      TITAN_CHECK(mode == DataMode::pretrain, path_,
                  ": a plain text file has no chat messages (chat data must be JSON with "
                  "\"messages\")");
      const Span& s = spans_[i];
      Record r;
      r.text = bytes_.substr(s.begin, s.end - s.begin);
      r.where = path_ + ":" + std::to_string(s.line);
      // Text is read as UTF-8, as JSON is: an ill-formed byte is a bad record (skippable with
      // skip_bad_records), not text silently repaired.
      for (size_t pos = 0; pos < r.text.size();) {
        const size_t n = utf8_valid_length(r.text, pos);
        if (n > 0) {
          pos += n;
          continue;
        }
        const size_t newline = pos == 0 ? std::string::npos : r.text.rfind('\n', pos - 1);
        const size_t line =
            s.line + static_cast<size_t>(
                         std::count(r.text.begin(), r.text.begin() + static_cast<long>(pos), '\n'));
        const size_t column = newline == std::string::npos ? pos + 1 : pos - newline;
        char byte[8];
        std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(r.text[pos]));
        throw BadRecordError(path_ + ":" + std::to_string(line) + ": not valid UTF-8 (byte " +
                             byte + " at column " + std::to_string(column) +
                             "): text files are read as UTF-8, as JSON is");
      }
      return r;
    }
    case Format::json_lines: {
      const Span& s = spans_[i];
      std::string where = path_ + ":" + std::to_string(s.line);
      json j;
      try {
        j = parse_json_strict(std::string_view(bytes_).substr(s.begin, s.end - s.begin), where,
                              "the record", kMaxJsonDocumentDepth);
      } catch (const Error& e) {
        throw BadRecordError(e.what());
      }
      return from_json(j, std::move(where), mode);
    }
    case Format::json_array:
      return from_json(array_[i], path_ + ": element " + std::to_string(i), mode);
  }
  fail(path_, ": unknown format");
}

Record DocumentFile::from_json(const json& j, std::string where, DataMode mode) const {
  Record r;
  r.where = std::move(where);
  if (!j.is_object()) throw BadRecordError(r.where + ": the record is not a JSON object");
  if (mode == DataMode::chat) {
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
      throw BadRecordError(r.where + ": no non-empty \"messages\" list");
    }
    r.kind = Record::Kind::chat;
    for (size_t m = 0; m < j["messages"].size(); ++m) {
      r.messages.push_back(parse_message(j["messages"][m], r.where, m));
    }
    return r;
  }
  const std::string& field = options_.text_field;
  if (j.contains(field)) {
    if (!j[field].is_string()) {
      throw BadRecordError(r.where + ": \"" + field + "\" is not a string");
    }
    r.text = j[field].get<std::string>();
    return r;
  }
  if (j.contains("ids")) {
    if (!j["ids"].is_array()) throw BadRecordError(r.where + ": \"ids\" is not a list");
    r.kind = Record::Kind::ids;
    r.ids.reserve(j["ids"].size());
    for (const json& id : j["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        throw BadRecordError(r.where + ": \"ids\" holds " + json_excerpt(id) +
                             ", not a non-negative 32-bit integer");
      }
      r.ids.push_back(id.get<int32_t>());
    }
    return r;
  }
  throw BadRecordError(r.where + ": no \"" + field + "\" field (nor an \"ids\" list)");
}

}  // namespace titan
