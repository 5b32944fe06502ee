// titan tokenize: text to token ids and back with a Hugging Face tokenizer.json.
//   --text T                     print the ids of T
//   --jsonl IN [--out FILE]      {"text": ...} per line -> {"ids": [...]} per line, same order
//                                (FILE must not exist yet)
//   --decode                     the other way: ids on --text, or {"ids": [...]} lines -> {"text":
//   ...}
//   --bin OUT FILES...           dataset files (text, JSON Lines, JSON, gzip; dirs, globs) -> one
//                                binary token file (titan/data/token_file.h) for training
// Throughput (tokens/s) goes to stderr so stdout stays clean output.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/data/dataset_tokenize.h"
#include "titan/data/tokenizer.h"
#include "titan/distributed/communicator.h"
#include "titan/distributed/world.h"
#include "titan/io/atomic_dir.h"
#include "titan/io/json_util.h"

namespace titan::cli {
namespace {

using nlohmann::json;

struct TokenizeOptions {
  std::string tokenizer, text, jsonl, out, bin, text_field = "text";
  std::vector<std::string> inputs;  // --bin: dataset files, directories, globs
  bool text_given = false, decode = false, no_special = false, skip_special = false;
  bool skip_bad_lines = false;
  int threads = 1;
};

// Lines per parallel batch: large enough to keep the threads busy, small enough to bound memory.
constexpr size_t kBatchLines = 8192;

void report_rate(size_t n_tokens, size_t n_lines, double seconds) {
  std::fprintf(stderr, "tokenize: %zu lines, %zu tokens in %.3f s (%.0f tokens/s)\n", n_lines,
               n_tokens, seconds, seconds > 0 ? static_cast<double>(n_tokens) / seconds : 0.0);
}

int32_t checked_id(const Tokenizer& tok, int64_t id, const std::string& where) {
  TITAN_CHECK(id >= 0 && static_cast<uint64_t>(id) < tok.vocab_size(), where, ": id ", id,
              " is outside the vocabulary [0, ", tok.vocab_size(), ")");
  return static_cast<int32_t>(id);
}

std::vector<int32_t> parse_id_list(const Tokenizer& tok, const std::string& s) {
  std::string cleaned = s;
  for (char& c : cleaned) {
    if (c == ',' || c == '[' || c == ']') c = ' ';
  }
  std::istringstream in(cleaned);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TITAN_CHECK(used == word.size(), "--text: \"", word, "\" is not a token id");
    ids.push_back(checked_id(tok, id, "--text"));
  }
  return ids;
}

// One JSON Lines record -> its output line; errors name the input line.
std::string convert_line(const Tokenizer& tok, const TokenizeOptions& o, const std::string& line,
                         const std::string& where, size_t& n_tokens) {
  json record = parse_json_strict(line, where, "the record", kMaxJsonDocumentDepth);
  if (o.decode) {
    TITAN_CHECK(record.is_object() && record.contains("ids") && record["ids"].is_array(), where,
                ": no \"ids\" list");
    std::vector<int32_t> ids;
    for (const json& id : record["ids"]) {
      TITAN_CHECK(id.is_number_integer(), where, ": \"ids\" holds a non-integer");
      ids.push_back(checked_id(tok, id.get<int64_t>(), where));
    }
    n_tokens = ids.size();
    return json{{"text", tok.decode(ids, o.skip_special)}}.dump();
  }
  TITAN_CHECK(record.is_object() && record.contains("text") && record["text"].is_string(), where,
              ": no string \"text\" field");
  const std::vector<int32_t> ids = tok.encode(record["text"].get<std::string>(), !o.no_special);
  n_tokens = ids.size();
  std::string out = "{\"ids\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  return out + "]}";
}

// Converts each batch of lines in parallel and writes the results in input order. Blank lines are
// not records and are skipped.
void convert_jsonl(const Tokenizer& tok, const TokenizeOptions& o, std::ostream& out) {
  std::ifstream in(o.jsonl, std::ios::binary);
  TITAN_CHECK(in, o.jsonl, ": cannot open");
  const auto start = std::chrono::steady_clock::now();
  size_t n_tokens = 0, n_lines = 0, line_no = 0;
  std::vector<std::string> lines, results, errors;
  std::vector<size_t> numbers, counts;
  std::string line;
  bool more = true;
  while (more) {
    lines.clear();
    numbers.clear();
    while (lines.size() < kBatchLines && (more = static_cast<bool>(std::getline(in, line)))) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      lines.push_back(std::move(line));
      numbers.push_back(line_no);
    }
    const auto n = static_cast<int64_t>(lines.size());
    results.assign(lines.size(), {});
    errors.assign(lines.size(), {});
    counts.assign(lines.size(), 0);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) {
      // Exceptions cannot leave an OpenMP region; keep the message and raise it afterwards.
      try {
        results[i] =
            convert_line(tok, o, lines[i], o.jsonl + ":" + std::to_string(numbers[i]), counts[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
    for (const std::string& e : errors) {
      if (!e.empty()) fail(e);
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      out << results[i] << '\n';
      n_tokens += counts[i];
    }
    n_lines += lines.size();
  }
  TITAN_CHECK(out.good(), "writing ", o.out.empty() ? "stdout" : o.out, " failed");
  report_rate(n_tokens, n_lines,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Writes to OUT.tmp.<pid> and renames it to OUT only when everything succeeded, so a failed run
// never leaves a partial file under the final name.
void convert_jsonl_to_file(const Tokenizer& tok, const TokenizeOptions& o) {
  check_destination_apart(o.out, o.jsonl, "the input");
  // A file of ids carries no mark of who wrote it, so none is ever replaced.
  std::error_code probe;
  TITAN_CHECK(!std::filesystem::exists(o.out, probe), o.out,
              ": exists; titan tokenize --out does not replace a file (remove it or choose "
              "another name)");
  const std::string tmp = o.out + ".tmp." + std::to_string(::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      TITAN_CHECK(out, o.out, ": cannot create ", tmp);
      convert_jsonl(tok, o, out);
      out.close();
      TITAN_CHECK(out.good(), o.out, ": writing ", tmp, " failed");
    }
    std::filesystem::rename(tmp, o.out);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

// Under mpirun the ranks of the world tokenize a share each (dataset_tokenize.h): the lengths
// summed, the tokens sent to rank 0 (an all-to-all-v in which only rank 0 receives).
TokenizeRanks world_ranks() {
  Communicator& group = world();
  TokenizeRanks ranks;
  ranks.rank = group.rank();
  ranks.size = group.size();
  if (ranks.size == 1) return ranks;
  ranks.sum = [&group](double* values, int64_t count) { group.all_reduce_sum(values, count); };
  ranks.gather = [&group](const std::vector<int32_t>& mine, std::vector<int32_t>& all) {
    std::vector<int64_t> send(static_cast<size_t>(group.size()), 0);
    send[0] = static_cast<int64_t>(mine.size());
    const std::vector<int64_t> receive = group.all_to_all_counts(send);
    int64_t total = 0;
    for (const int64_t n : receive) total += n;
    std::vector<int32_t> into(static_cast<size_t>(total));
    group.all_to_all_v_async(mine.data(), send, into.data(), receive, DType::i32).wait();
    if (group.rank() == 0) all = std::move(into);
  };
  return ranks;
}

// --bin: the whole dataset into one token file, tokenized on all threads (of every rank under
// mpirun).
int write_bin(const Tokenizer& tok, const TokenizeOptions& o) {
  TITAN_CHECK(!o.decode, "--bin writes token ids; it does not combine with --decode");
  DatasetOptions data;
  data.paths = o.inputs;
  if (!o.jsonl.empty()) data.paths.insert(data.paths.begin(), o.jsonl);
  data.text_field = o.text_field;
  data.skip_bad_records = o.skip_bad_lines;
  data.parse_special = !o.no_special;
  const TokenizeStats s = tokenize_to_token_file(tok, data, o.bin, world_ranks());
  if (world().rank() != 0) return 0;  // rank 0 wrote the file and says so
  if (s.n_skipped > 0) {
    std::fprintf(stderr, "tokenize: skipped %lld bad record(s); the first: %s\n",
                 static_cast<long long>(s.n_skipped), s.first_skipped.c_str());
  }
  std::fprintf(
      stderr, "tokenize: %lld files, %lld documents, %lld tokens in %.3f s (%.0f tokens/s) -> %s\n",
      static_cast<long long>(s.n_files), static_cast<long long>(s.n_docs),
      static_cast<long long>(s.n_tokens), s.seconds,
      s.seconds > 0 ? static_cast<double>(s.n_tokens) / s.seconds : 0.0, o.bin.c_str());
  return 0;
}

int run(const TokenizeOptions& o) {
  set_thread_count(o.threads);
  TITAN_CHECK(world().size() == 1 || !o.bin.empty(),
              "under mpirun titan tokenize runs only with --bin (the ranks tokenize a share each)");
  TITAN_CHECK(o.text_given || !o.jsonl.empty() || !o.bin.empty(),
              "nothing to do (give --text, --jsonl or --bin)");
  TITAN_CHECK(o.inputs.empty() || !o.bin.empty(), "input files are read only with --bin");
  const Tokenizer tok = Tokenizer::load(o.tokenizer);
  if (!o.bin.empty()) return write_bin(tok, o);
  if (!o.jsonl.empty()) {
    if (o.out.empty()) {
      convert_jsonl(tok, o, std::cout);
    } else {
      convert_jsonl_to_file(tok, o);
    }
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  size_t n_tokens = 0;
  if (o.decode) {
    const std::vector<int32_t> ids = parse_id_list(tok, o.text);
    n_tokens = ids.size();
    std::cout << tok.decode(ids, o.skip_special) << '\n';
  } else {
    const std::vector<int32_t> ids = tok.encode(o.text, !o.no_special);
    n_tokens = ids.size();
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i > 0 ? " " : "") << ids[i];
    std::cout << '\n';
  }
  report_rate(n_tokens, 1,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

Action add_tokenize_command(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("tokenize", "text to token ids and back with a tokenizer.json");
  static TokenizeOptions o;
  command->add_option("--tokenizer", o.tokenizer, "model folder or tokenizer.json")->required();
  CLI::Option* text = command->add_option(
      "--text", o.text, "encode this text and print the ids (with --decode: ids to decode)");
  CLI::Option* jsonl = command->add_option(
      "--jsonl", o.jsonl,
      "JSON Lines with a \"text\" field -> {\"ids\": [...]} lines (with --decode: the reverse)");
  text->excludes(jsonl);
  CLI::Option* out =
      command->add_option("--out", o.out, "output file for --jsonl (default: stdout)")
          ->needs(jsonl);
  CLI::Option* bin = command->add_option(
      "--bin", o.bin, "write the input files (and --jsonl) as one binary token file");
  bin->excludes(text)->excludes(out);
  command->add_option("files", o.inputs, "with --bin: files, directories or glob patterns");
  command->add_option("--text-field", o.text_field, "with --bin: JSON field holding the text")
      ->default_str("text");
  command->add_flag("--skip-bad-lines", o.skip_bad_lines,
                    "with --bin: skip unreadable records and report their count");
  command->add_flag("--decode", o.decode, "ids to text");
  command->add_flag("--no-special", o.no_special,
                    "encode special-token strings in the text as plain text");
  command->add_flag("--skip-special", o.skip_special, "drop special tokens when decoding");
  add_threads_option(*command, o.threads);
  return [text] {
    o.text_given = text->count() > 0;
    return run(o);
  };
}

}  // namespace titan::cli
