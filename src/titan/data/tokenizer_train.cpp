#include "titan/data/tokenizer_train.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "titan/core/cache_dir.h"
#include "titan/core/progress.h"
#include "titan/data/dataset_read.h"
#include "titan/io/atomic_dir.h"

namespace titan {

TokenizerTrainStats train_tokenizer(const DatasetOptions& data, const BpeTrainerOptions& options,
                                    const std::string& out_dir, bool overwrite) {
  const auto start = std::chrono::steady_clock::now();
  TokenizerTrainStats stats;
  BpeTrainer trainer(options);
  const std::vector<std::string> inputs = expand_data_paths(data.paths);
  for (const std::string& path : inputs) check_destination_apart(out_dir, path, "the input");
  AtomicDir out(out_dir, "tokenizer", overwrite);  // a refused destination before the work
  Progress reading("tokenizer training: reading", 0, ProgressUnit::bytes);
  for (const std::string& path : inputs) {
    const DocumentFile file = DocumentFile::open(path, data);
    for (size_t i = 0; i < file.size(); ++i) {
      Record r;
      try {
        r = file.record(i, DataMode::pretrain);
      } catch (const BadRecordError&) {
        if (data.skip_bad_records) continue;
        throw;
      }
      TITAN_CHECK(r.kind == Record::Kind::text, r.where,
                  ": already tokenized (\"ids\" or a token file); a tokenizer trains on text");
      trainer.add_text(r.text);
      ++stats.n_docs;
      stats.n_bytes += static_cast<int64_t>(r.text.size());
      reading.advance(static_cast<int64_t>(r.text.size()));
    }
  }
  reading.finish();
  TITAN_CHECK(stats.n_docs > 0, "tokenizer training: the files hold no text");
  const TrainedBpe bpe = trainer.train();
  write_hf_tokenizer(bpe, out.staging());
  out.commit();
  stats.vocab_size = bpe.total_size();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

std::string default_corpus() {
  std::error_code ec;
  TITAN_CHECK(std::filesystem::is_regular_file(kDefaultCorpus, ec), "the default corpus ",
              kDefaultCorpus,
              " is missing: install Debian's jargon-text package (scripts/setup.sh does)");
  return kDefaultCorpus;
}

std::string default_tokenizer_dir() {
  return cache_dir("the default tokenizer") + "/debug-tokenizer-v1-" +
         std::to_string(kDefaultVocabSize);
}

std::string ensure_default_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json", ec)) {
    return dir;
  }
  DatasetOptions data;
  data.paths = {default_corpus()};
  BpeTrainerOptions options;
  options.vocab_size = kDefaultVocabSize;
  try {
    train_tokenizer(data, options, dir);
  } catch (const Error&) {
    // Another process (a rank started at the same time) wrote the same tokenizer first.
    if (!std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json", ec)) {
      throw;
    }
  }
  return dir;
}

}  // namespace titan
