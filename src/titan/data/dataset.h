// One dataset file as a list of documents, whatever its format:
//   JSON Lines (.jsonl, .ndjson, and .json not starting with '[', as c4's files) and JSON lists
//   (.json starting with '['): one record per line / element, with a
//     text field (default "text", the c4 layout), an "ids" list of already-tokenized ids, or (chat
//     mode) a "messages" list of {"role", "content"[, "reasoning_content"]}.
//   plain text (any other name): one document per paragraph (blank lines separate them).
//   token files (the "TITANTOK" magic, any name; see token_file.h): one document per table entry.
// JSON and text files may be gzip-compressed (a ".gz" suffix is ignored when the format is
// chosen); token files are mapped in place and must not be.
// Records are parsed only when asked for, so a loader rank reads only its own share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/data/chat_template.h"
#include "titan/data/token_file.h"

namespace titan {

// Pre-training reads text or ids; chat reads "messages" for fine-tuning with masked labels.
enum class DataMode { pretrain, chat };

struct DatasetOptions {
  std::vector<std::string> paths;  // files, directories, glob patterns (expand_data_paths)
  std::string text_field = "text";
  // Skip records that cannot be read (bad JSON, a missing field) and count them instead of
  // stopping; the count is reported. Broken files (truncated gzip, bad token file) always stop.
  bool skip_bad_records = false;
  // Special-token strings in text become their ids (Hugging Face's default); false encodes them
  // as plain text.
  bool parse_special = true;
};

// A record that cannot be read; with skip_bad_records it is counted and skipped.
class BadRecordError : public Error {
 public:
  using Error::Error;
};

struct Record {
  enum class Kind { text, ids, chat };
  Kind kind = Kind::text;
  std::string text;                   // kind text
  std::vector<int32_t> ids;           // kind ids
  std::vector<ChatMessage> messages;  // kind chat
  std::string where;                  // "file:line", "file: element i", ... for messages
};

// Whether the file is a token file (the "TITANTOK" magic at its start); reads only that.
bool is_token_file_path(const std::string& path);

class DocumentFile {
 public:
  // Reads (and gunzips) the file and finds its document boundaries. Errors name the file.
  static DocumentFile open(const std::string& path, const DatasetOptions& options);

  size_t size() const { return n_docs_; }
  const std::string& path() const { return path_; }
  // The vocabulary the file's ids were written for: a token file's header, else 0 (unknown).
  uint32_t vocab_size() const { return token_file_ ? token_file_->vocab_size() : 0; }
  // The token file's reader, or null for the other formats: its document table gives a
  // document's length without reading its tokens.
  const std::shared_ptr<const TokenFileReader>& token_file() const { return token_file_; }

  // Document i as the mode asks for it. A record that does not hold what the mode needs throws
  // BadRecordError naming the file and line; a text or token document in chat mode is an Error.
  Record record(size_t i, DataMode mode) const;
  // Whether document i is a JSON record with a "messages" field: what a fine-tune of a model
  // folder reads as chat data (train/job_finetune.h). False for text and token files, and for a
  // record that is not valid JSON (reading it as a document reports that).
  bool has_messages(size_t i) const;

 private:
  enum class Format { json_lines, json_array, text, tokens };
  struct Span {
    size_t begin, end;  // byte range in bytes_
    size_t line;        // 1-based line of begin
  };

  // open() but for turning std::bad_alloc into an Error naming the file.
  static DocumentFile read(const std::string& path, const DatasetOptions& options);
  // record() but for turning std::bad_alloc into an Error naming the file.
  Record read_record(size_t i, DataMode mode) const;
  Record from_json(const nlohmann::json& j, std::string where, DataMode mode) const;

  std::string path_;
  DatasetOptions options_;
  Format format_ = Format::text;
  std::string bytes_;                                  // json_lines, text: the decompressed file
  std::vector<Span> spans_;                            // json_lines, text
  nlohmann::json array_;                               // json_array
  std::shared_ptr<const TokenFileReader> token_file_;  // tokens
  size_t n_docs_ = 0;
};

}  // namespace titan
