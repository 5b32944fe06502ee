#include "titan/data/dataset_tokenize.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
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
                                     const std::string& out_path, const TokenizeRanks& ranks) {
  const auto start = std::chrono::steady_clock::now();
  TokenizeStats stats;
  const std::vector<std::string> inputs = expand_data_paths(data.paths);
  check_destination(out_path, inputs);
  const bool writes = ranks.rank == 0;
  std::optional<TokenFileWriter> writer;
  if (writes) writer.emplace(out_path, static_cast<uint32_t>(tok.vocab_size()));
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> errors;
  std::vector<Outcome> outcomes;
  std::vector<double> lengths;          // several ranks: each document's, summed (kFailed, ...)
  std::vector<int32_t> mine, gathered;  // several ranks: this rank's tokens, rank 0's all
  std::optional<Progress> progress;
  if (writes) progress.emplace("tokenizing into " + out_path, 0, ProgressUnit::tokens);
  const int64_t size = ranks.size;
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
      // This rank's documents of the batch: k = rank, rank + size, ...
      const auto own = static_cast<int64_t>((n + size - 1 - ranks.rank) / size);
#pragma omp parallel for schedule(dynamic, 16)
      for (int64_t j = 0; j < own; ++j) {
        const auto k = static_cast<size_t>(ranks.rank + j * size);
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
      if (size > 1) {
        // The others' outcomes and lengths (-1 skipped, -2 failed), and their tokens on rank 0.
        lengths.assign(n, 0.0);
        mine.clear();
        for (size_t k = static_cast<size_t>(ranks.rank); k < n; k += static_cast<size_t>(size)) {
          lengths[k] = outcomes[k] == Outcome::ok ? static_cast<double>(ids[k].size())
                                                  : (outcomes[k] == Outcome::skipped ? -1.0 : -2.0);
          if (outcomes[k] == Outcome::ok) mine.insert(mine.end(), ids[k].begin(), ids[k].end());
        }
        ranks.sum(lengths.data(), static_cast<int64_t>(n));
        for (size_t k = 0; k < n; ++k) {
          const auto owner = static_cast<int64_t>(k) % size;
          if (owner == ranks.rank || lengths[k] >= 0) continue;
          outcomes[k] = lengths[k] == -1.0 ? Outcome::skipped : Outcome::failed;
          errors[k] = path + ": document " + std::to_string(first + k) +
                      " (from 0, in file order) is a bad record, read by rank " +
                      std::to_string(owner);
        }
        ranks.gather(mine, gathered);
        if (writes) {  // every rank's documents from its tokens, in rank order
          std::vector<size_t> at(static_cast<size_t>(size), 0);
          for (int64_t r = 1; r < size; ++r) {
            size_t tokens = 0;
            for (size_t k = static_cast<size_t>(r - 1); k < n; k += static_cast<size_t>(size)) {
              if (lengths[k] > 0) tokens += static_cast<size_t>(lengths[k]);
            }
            at[r] = at[r - 1] + tokens;
          }
          for (size_t k = 0; k < n; ++k) {
            if (lengths[k] < 0 || static_cast<int64_t>(k) % size == 0) continue;
            size_t& from = at[k % static_cast<size_t>(size)];
            const auto count = static_cast<size_t>(lengths[k]);
            ids[k].assign(gathered.begin() + static_cast<std::ptrdiff_t>(from),
                          gathered.begin() + static_cast<std::ptrdiff_t>(from + count));
            from += count;
          }
        }
      }
      for (size_t k = 0; k < n; ++k) {
        if (outcomes[k] == Outcome::failed) fail(errors[k]);
        if (outcomes[k] == Outcome::skipped) {
          if (stats.n_skipped++ == 0) stats.first_skipped = errors[k];
          continue;
        }
        if (!writes) continue;
        writer->add_doc(ids[k]);
        stats.n_tokens += static_cast<int64_t>(ids[k].size());
        progress->advance(static_cast<int64_t>(ids[k].size()));
        ++stats.n_docs;
      }
    }
  }
  if (writes) writer->commit();
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
