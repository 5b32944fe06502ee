// Loader throughput against the tokenizer's own single-thread encode speed on the same documents,
// measured in the same run, and the loader's share of step time when the consumer "trains" for a
// fixed time per batch (the background thread must hide tokenisation: bar < 2%).
//
// usage: bench_loader [TOKENIZER_DIR] [DATA...]
//   TOKENIZER_DIR defaults to the default tokenizer (trained into a temporary folder), DATA to the
//   default corpus (docs/DATA.md).
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_main.h"
#include "titan/core/error.h"
#include "titan/data/dataset.h"
#include "titan/data/dataset_read.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer_train.h"

namespace {

using titan::bench::now_seconds;

// Tokens/s of plain single-thread encode over every document of the files.
double encode_rate(const titan::Tokenizer& tok, const std::vector<std::string>& paths) {
  size_t n_tokens = 0;
  const double start = now_seconds();
  for (const std::string& path : titan::expand_data_paths(paths)) {
    const titan::DocumentFile f = titan::DocumentFile::open(path, {});
    for (size_t i = 0; i < f.size(); ++i) {
      const titan::Record r = f.record(i, titan::DataMode::pretrain);
      n_tokens += r.kind == titan::Record::Kind::text ? tok.encode(r.text).size() : r.ids.size();
    }
  }
  return static_cast<double>(n_tokens) / (now_seconds() - start);
}

titan::LoaderOptions options(const std::vector<std::string>& paths) {
  titan::LoaderOptions o;
  o.data.paths = paths;
  o.batch_size = 8;
  o.seq_len = 512;
  o.epochs = 1;
  return o;
}

// Tokens/s of the loader when batches are taken as fast as it makes them.
double loader_rate(const titan::Tokenizer& tok, const std::vector<std::string>& paths) {
  const double start = now_seconds();
  titan::DataLoader loader(options(paths), tok);
  size_t n_tokens = 0;
  while (const auto batch = loader.next_batch()) n_tokens += batch->input_ids.size();
  return static_cast<double>(n_tokens) / (now_seconds() - start);
}

// Fraction of wall time spent waiting in next_batch when each step computes for step_s, after
// the first batch (which pays for opening the first file once per run).
double loader_share(const titan::Tokenizer& tok, const std::vector<std::string>& paths,
                    double step_s, int steps) {
  titan::DataLoader loader(options(paths), tok);
  loader.next_batch();
  double waited = 0;
  const double start = now_seconds();
  for (int s = 0; s < steps; ++s) {
    const double t = now_seconds();
    if (!loader.next_batch()) break;
    waited += now_seconds() - t;
    std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
  }
  return waited / (now_seconds() - start);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string tmp = std::filesystem::temp_directory_path() /
                            ("titan_bench_loader_" + std::to_string(::getpid()));
    const std::string dir = argc > 1 ? argv[1] : titan::ensure_default_tokenizer(tmp);
    std::vector<std::string> paths(argv + std::min(argc, 2), argv + argc);
    if (paths.empty()) paths = {titan::default_corpus()};
    const titan::Tokenizer tok = titan::Tokenizer::load(dir);
    const double encode = encode_rate(tok, paths);
    const double loader = loader_rate(tok, paths);
    std::printf("encode, 1 thread:        %10.0f tokens/s\n", encode);
    std::printf("loader (B=8, S=512):     %10.0f tokens/s  (%.2fx the plain encode)\n", loader,
                loader / encode);
    // A step that takes as long as the loader needs for one batch, then 4x, 16x, 64x longer.
    const double batch_s = 8 * 512 / loader;
    for (const double factor : {1.0, 4.0, 16.0, 64.0}) {
      const double share = loader_share(tok, paths, factor * batch_s, 40);
      std::printf("step of %7.2f ms: loader share of step time %5.2f%%\n", 1e3 * factor * batch_s,
                  100 * share);
    }
    std::filesystem::remove_all(tmp);
  } catch (const titan::Error& e) {
    std::fprintf(stderr, "bench_loader: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
