#include "titan/data/dataset_tokenize.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <vector>

#include "titan/core/progress.h"
#include "titan/data/dataset_read.h"
#include "titan/data/token_file.h"
#include "titan/io/atomic_dir.h"

namespace titan {
namespace {

// Documents per parallel batch: enough to keep the threads busy, few enough to bound memory.
constexpr size_t kBatchDocs = 8192;

enum class Outcome { ok, skipped, failed };

// out_path may replace only a token file (what titan wrote there before), and never an input.
void check_destination(const std::string& out_path, const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) check_destination_apart(out_path, input, "the input");
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(out_path, ec))) return;
  std::ifstream in(out_path, std::ios::binary);
  std::string magic(kTokenFileMagic.size(), '\0');
  in.read(magic.data(), static_cast<std::streamsize>(magic.size()));
  TITAN_CHECK(std::filesystem::is_regular_file(out_path, ec) && in.gcount() == std::ssize(magic) &&
                  is_token_file(magic),
              out_path,
              ": already exists and is not a token file, so it is not replaced (choose another "
              "output)");
}

}  // namespace

TokenizeStats tokenize_to_token_file(const Tokenizer& tok, const DatasetOptions& data,
                                     const std::string& out_path) {
  const auto start = std::chrono::steady_clock::now();
  TokenizeStats stats;
  const std::vector<std::string> inputs = expand_data_paths(data.paths);
  check_destination(out_path, inputs);
  TokenFileWriter writer(out_path, static_cast<uint32_t>(tok.vocab_size()));
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> errors;
  std::vector<Outcome> outcomes;
  Progress progress("tokenizing into " + out_path, 0, ProgressUnit::tokens);
  for (const std::string& path : inputs) {
    const DocumentFile file = DocumentFile::open(path, data);
    TITAN_CHECK(file.vocab_size() == 0 || file.vocab_size() == tok.vocab_size(), path,
                ": written for a vocabulary of ", file.vocab_size(), " ids, but the tokenizer has ",
                tok.vocab_size());
    ++stats.n_files;
    for (size_t first = 0; first < file.size(); first += kBatchDocs) {
      const size_t n = std::min(kBatchDocs, file.size() - first);
      ids.assign(n, {});
      errors.assign(n, {});
      outcomes.assign(n, Outcome::ok);
#pragma omp parallel for schedule(dynamic, 16)
      for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) {
        // Exceptions cannot leave an OpenMP region; keep the message and raise it afterwards.
        try {
          Record r = file.record(first + k, DataMode::pretrain);
          if (r.kind == Record::Kind::text) {
            // As the loader encodes text documents (with the post-processor's special tokens).
            if (!r.text.empty())
              ids[k] = tok.encode_with_special_tokens(r.text, data.parse_special);
          } else {
            for (const int32_t id : r.ids) {
              if (static_cast<size_t>(id) >= tok.vocab_size()) {
                throw BadRecordError(r.where + ": id " + std::to_string(id) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(tok.vocab_size()) + ")");
              }
            }
            ids[k] = std::move(r.ids);
          }
        } catch (const BadRecordError& e) {
          outcomes[k] = data.skip_bad_records ? Outcome::skipped : Outcome::failed;
          errors[k] = e.what();
        } catch (const std::exception& e) {
          outcomes[k] = Outcome::failed;
          errors[k] = e.what();
        }
      }
      for (size_t k = 0; k < n; ++k) {
        if (outcomes[k] == Outcome::failed) fail(errors[k]);
        if (outcomes[k] == Outcome::skipped) {
          if (stats.n_skipped++ == 0) stats.first_skipped = errors[k];
          continue;
        }
        writer.add_doc(ids[k]);
        stats.n_tokens += static_cast<int64_t>(ids[k].size());
        progress.advance(static_cast<int64_t>(ids[k].size()));
        ++stats.n_docs;
      }
    }
  }
  writer.commit();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

int64_t count_packed_tokens(const Tokenizer& tok, const DatasetOptions& data) {
  int64_t n = 0;
  for (const std::string& path : expand_data_paths(data.paths)) {
    const DocumentFile file = DocumentFile::open(path, data);
    for (size_t i = 0; i < file.size(); ++i) {
      const Record r = file.record(i, DataMode::pretrain);
      const size_t ids =
          r.kind == Record::Kind::text
              ? (r.text.empty() ? 0
                                : tok.encode_with_special_tokens(r.text, data.parse_special).size())
              : r.ids.size();
      if (ids > 0) n += static_cast<int64_t>(ids) + 1;  // + the EOS the loader appends
    }
  }
  return n;
}

}  // namespace titan
