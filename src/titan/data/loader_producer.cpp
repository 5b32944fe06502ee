#include "titan/data/loader_producer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "titan/core/rng.h"
#include "titan/data/dataset_chat.h"

namespace titan {
namespace {

const char* mode_name(const LoaderOptions& options) {
  if (options.mode != DataMode::chat) return "pretrain";
  return options.pack_conversations ? "chat_packed" : "chat";
}

// Names and sizes of the files, hashed: a resumed run must read the same data.
std::string fingerprint(const std::vector<std::string>& files) {
  std::string key;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(f, ec);
    key +=
        std::filesystem::path(f).filename().string() + ":" + std::to_string(ec ? 0 : size) + "\n";
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a_hash(key)));
  return std::to_string(files.size()) + "-" + hex;
}

// Unbiased integer in [0, n) (rejection of the short top range).
uint64_t uniform_below(Rng& rng, uint64_t n) {
  const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  for (;;) {
    const uint64_t x = rng.next_u64();
    if (x < limit) return x % n;
  }
}

std::vector<int64_t> shuffled(int64_t n, bool shuffle, uint64_t seed, const std::string& stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  Rng rng(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[i], order[uniform_below(rng, static_cast<uint64_t>(i) + 1)]);
  }
  return order;
}

template <typename T>
void check_same(const char* what, const T& saved, const T& now) {
  TITAN_CHECK(saved == now, "loader state: saved with ", what, " ", saved, ", but this run has ",
              now);
}

// A pre-training document's ids: the text encoded with the post-processor's special tokens, or the
// "ids" as they are, then the EOS. An empty document adds nothing, not even a separator (nor a
// BOS).
std::vector<int32_t> packed_ids(Record r, const Tokenizer& tok, bool parse_special, int32_t eos) {
  std::vector<int32_t> ids;
  if (r.kind == Record::Kind::ids) {
    ids = std::move(r.ids);
  } else if (!r.text.empty()) {
    ids = tok.encode_with_special_tokens(r.text, parse_special);
  }
  if (!ids.empty()) ids.push_back(eos);
  return ids;
}

// A record's tokens as the loader packs them: a conversation's ids and labels (encode_chat with
// `chat`), else the packed_ids.
DocumentTokens document_tokens(Record r, const Tokenizer& tok, const ChatTemplate* chat,
                               bool parse_special, int32_t eos) {
  DocumentTokens t;
  const std::string where = r.where;
  try {
    if (r.kind == Record::Kind::chat) {
      encode_chat(tok, *chat, r.messages, t.ids, t.labels);
    } else {
      t.ids = packed_ids(std::move(r), tok, parse_special, eos);
    }
  } catch (const BadRecordError&) {
    throw;
  } catch (const Error& e) {  // a record that reads but does not encode: named by its place
    fail(where, ": ", e.what());
  }
  return t;
}

}  // namespace

BatchProducer::BatchProducer(const LoaderOptions& options, const Tokenizer& tok,
                             std::vector<std::string> files,
                             const std::optional<LoaderState>& start)
    : options_(options), tok_(tok), files_(std::move(files)) {
  TITAN_CHECK(options.batch_size >= 1, "loader: batch_size must be >= 1, got ", options.batch_size);
  TITAN_CHECK(options.seq_len >= 1, "loader: seq_len must be >= 1, got ", options.seq_len);
  TITAN_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
              "loader: rank ", options.rank, " is outside [0, world_size ", options.world_size,
              ")");
  TITAN_CHECK(options.epochs >= 0, "loader: epochs must be >= 0, got ", options.epochs);
  TITAN_CHECK(!files_.empty(), "loader: no dataset files");
  const LoaderOptions::Share& share = options.share;
  TITAN_CHECK(share.step_batches >= 1 && share.first >= 0 && share.count >= 1 &&
                  share.first + share.count <= share.step_batches,
              "loader: batches [", share.first, ", ", share.first + share.count,
              ") of each step's ", share.step_batches, " are not a share of them");
  eos_ = tok.eos_id();
  pad_ = tok.pad_id() >= 0 ? tok.pad_id() : eos_;
  TITAN_CHECK(eos_ >= 0, "loader: the tokenizer has no eos_token (tokenizer_config.json), which ",
              options.mode == DataMode::chat ? "pads conversations" : "separates documents");

  TITAN_CHECK(options.mode != DataMode::chat || options.chat_template,
              "loader: chat data needs the ",
              "chat template of the tokenizer's folder (LoaderOptions::chat_template)");
  if (options.mode == DataMode::chat) check_chat_tokenizer(tok, *options.chat_template);
  const bool text = std::any_of(files_.begin(), files_.end(),
                                [](const std::string& f) { return !is_token_file_path(f); });
  const bool packed = options.mode == DataMode::pretrain || options.pack_conversations;
  if (packed && share.count < share.step_batches && text) {
    // Another rank's packed rows of text or conversations end where their tokens say: the ranks
    // split the tokenizing of each window of documents and sum the lengths (loader.h).
    const char* what = options.mode == DataMode::chat ? "packed conversations" : "packed text";
    TITAN_CHECK(share.step_batches % share.count == 0 && share.first % share.count == 0,
                "loader: ", what, " shared over data-parallel ranks needs runs of ", share.count,
                " batches dividing the step's ", share.step_batches, " from ", share.first);
    TITAN_CHECK(static_cast<bool>(options.sum_over_ranks), "loader: ", what,
                " shared over data-parallel ranks needs "
                "LoaderOptions::sum_over_ranks (the ranks sum their documents' lengths)");
    dp_ranks_ = share.step_batches / share.count;
    dp_rank_ = share.first / share.count;
  }
  state_.mode = mode_name(options);
  state_.seed = options.seed;
  state_.shuffle = options.shuffle;
  state_.seq_len = options.seq_len;
  state_.rank = options.rank;
  state_.world_size = options.world_size;
  state_.files_fingerprint = fingerprint(files_);
  if (!start) return;
  const LoaderState& s = *start;
  check_same("mode", s.mode, state_.mode);
  check_same("seed", s.seed, state_.seed);
  check_same("shuffle", s.shuffle, state_.shuffle);
  check_same("seq_len", s.seq_len, state_.seq_len);
  check_same("rank", s.rank, state_.rank);
  check_same("world_size", s.world_size, state_.world_size);
  check_same("dataset files (count-hash of names and sizes)", s.files_fingerprint,
             state_.files_fingerprint);
  TITAN_CHECK(s.file < static_cast<int64_t>(files_.size()), "loader state: file position ", s.file,
              " is past the ", files_.size(), " files");
  TITAN_CHECK(static_cast<int64_t>(s.carry.size()) <= options.seq_len, "loader state: carry of ",
              s.carry.size(), " tokens is longer than seq_len");
  for (const int32_t id : s.carry) {
    TITAN_CHECK(id >= 0 && static_cast<size_t>(id) < tok.vocab_size(),
                "loader state: carry holds id ", id, ", outside the vocabulary");
  }
  state_ = s;
  if (state_.doc_offset > 0) {
    // Mid-document: tokenize that document again (deterministic) and go on from the offset.
    open_file();
    TITAN_CHECK(state_.doc < static_cast<int64_t>(own_docs_.size()) &&
                    read_document(state_.doc, doc_, /*alone=*/true) &&
                    state_.doc_offset <= static_cast<int64_t>(doc_.length),
                "loader state: document ", state_.doc, " of ",
                files_[file_order(state_.epoch)[state_.file]], " does not reach offset ",
                state_.doc_offset, " (has the data changed?)");
    doc_loaded_ = true;
  }
}

std::vector<int64_t> BatchProducer::file_order(int64_t epoch) const {
  return shuffled(static_cast<int64_t>(files_.size()), options_.shuffle, options_.seed,
                  "titan.loader/files/epoch=" + std::to_string(epoch));
}

void BatchProducer::open_file() {
  if (file_ && file_epoch_ == state_.epoch && file_pos_ == state_.file) return;
  const int64_t index = file_order(state_.epoch)[state_.file];
  close_file();
  file_ = std::make_shared<const DocumentFile>(DocumentFile::open(files_[index], options_.data));
  window_begin_ = 0;
  window_lengths_.clear();
  file_epoch_ = state_.epoch;
  file_pos_ = state_.file;
  file_skipped_ = 0;
  file_first_skip_.clear();
  TITAN_CHECK(file_->vocab_size() == 0 || file_->vocab_size() == tok_.vocab_size(), file_->path(),
              ": written for a vocabulary of ", file_->vocab_size(), " ids, but the tokenizer has ",
              tok_.vocab_size());
  const std::vector<int64_t> order = shuffled(
      static_cast<int64_t>(file_->size()), options_.shuffle, options_.seed,
      "titan.loader/docs/epoch=" + std::to_string(state_.epoch) + "/file=" + std::to_string(index));
  own_docs_.clear();
  for (size_t p = options_.rank; p < order.size(); p += options_.world_size) {
    own_docs_.push_back(order[p]);
  }
}

void BatchProducer::finish_file() {
  if (file_skipped_ > 0) {
    warn(file_->path() + ": skipped " + std::to_string(file_skipped_) +
         " bad record(s); the first: " + file_first_skip_);
  }
  close_file();
}

void BatchProducer::warn(const std::string& line) const {
  if (options_.warn) {
    options_.warn(line);
  } else {
    std::fprintf(stderr, "titan: warning: %s\n", line.c_str());
  }
}

void BatchProducer::close_file() {
  if (file_ && file_->token_file()) closed_tokens_read_ += file_->token_file()->tokens_read();
  file_.reset();
}

uint64_t BatchProducer::tokens_read() const {
  const bool open = file_ && file_->token_file();
  return closed_tokens_read_ + (open ? file_->token_file()->tokens_read() : 0);
}

LoaderPosition BatchProducer::position() const {
  return {state_, unread_carry_};
}

bool BatchProducer::skims_rows() const {
  return !own_batch_ && options_.mode == DataMode::chat && !options_.pack_conversations;
}

bool BatchProducer::measures_token_file() const {
  return options_.mode == DataMode::pretrain && file_->token_file();
}

bool BatchProducer::shares_lengths() const {
  return dp_ranks_ > 1 && !file_->token_file();
}

Record BatchProducer::read_record(int64_t doc) const {
  Record r = file_->record(static_cast<size_t>(own_docs_[doc]), options_.mode);
  if (r.kind == Record::Kind::ids) {
    for (const int32_t id : r.ids) {
      if (static_cast<size_t>(id) >= tok_.vocab_size()) {
        throw BadRecordError(r.where + ": id " + std::to_string(id) +
                             " is outside the vocabulary [0, " + std::to_string(tok_.vocab_size()) +
                             ")");
      }
    }
  }
  return r;
}

bool BatchProducer::skip_bad_record(std::exception_ptr error, const std::string& message) {
  if (!options_.data.skip_bad_records) std::rethrow_exception(error);
  if (file_skipped_++ == 0) file_first_skip_ = message;
  ++state_.skipped;
  return false;
}

bool BatchProducer::read_document(int64_t doc, Document& out, bool alone) {
  out.unread.reset();
  if (measures_token_file()) {  // its length from the table; its tokens read as rows take them
    out.ids.clear();
    out.labels.clear();
    out.where.clear();
    out.skimmed = false;
    out.token_file = file_->token_file();
    out.file_doc = static_cast<size_t>(own_docs_[doc]);
    const uint64_t n = out.token_file->doc_size(out.file_doc);
    out.length = n > 0 ? static_cast<size_t>(n) + 1 : 0;  // an empty document adds no EOS
    return true;
  }
  out.token_file.reset();
  if (!alone && shares_lengths()) return read_shared_document(doc, out);
  Record r;
  try {
    r = read_record(doc);
  } catch (const BadRecordError& e) {
    return skip_bad_record(std::current_exception(), e.what());
  }
  out.where = r.where;  // copied: an encoding error names it too
  out.labels.clear();
  out.skimmed = skims_rows();
  if (out.skimmed) {  // its row is another rank's: one conversation, whatever its tokens
    out.ids.clear();
    out.length = 0;
    return true;
  }
  if (r.kind != Record::Kind::ids) ++*tokenized_;
  DocumentTokens t =
      document_tokens(std::move(r), tok_, chat_template(), options_.data.parse_special, eos_);
  out.ids = std::move(t.ids);
  out.labels = std::move(t.labels);
  out.length = out.ids.size();
  return true;
}

void BatchProducer::share_lengths(int64_t doc) {
  constexpr int64_t kDocumentsPerRank = 128;  // per window: one sum over the ranks each
  const int64_t n =
      std::min(kDocumentsPerRank * dp_ranks_, static_cast<int64_t>(own_docs_.size()) - doc);
  window_begin_ = doc;
  window_docs_.assign(static_cast<size_t>(n), {});
  std::vector<double> lengths(static_cast<size_t>(n), 0.0);  // exact: far below 2^53
  for (int64_t i = dp_rank_; i < n; i += dp_ranks_) {
    WindowDocument& d = window_docs_[static_cast<size_t>(i)];
    try {
      Record r = read_record(doc + i);
      if (r.kind != Record::Kind::ids) ++*tokenized_;
      d.where = r.where;
      d.tokens =
          document_tokens(std::move(r), tok_, chat_template(), options_.data.parse_special, eos_);
      lengths[static_cast<size_t>(i)] = static_cast<double>(d.tokens.ids.size());
    } catch (const BadRecordError&) {
      d.error = std::current_exception();
      lengths[static_cast<size_t>(i)] = static_cast<double>(kBadRecord);
    } catch (const Error&) {  // raised on every rank when they reach it: unencodable_error
      d.error = std::current_exception();
      lengths[static_cast<size_t>(i)] = static_cast<double>(kUnencodable);
    }
  }
  options_.sum_over_ranks(lengths.data(), n);
  window_lengths_.assign(lengths.begin(), lengths.end());
}

bool BatchProducer::read_shared_document(int64_t doc, Document& out) {
  const auto window_end = window_begin_ + static_cast<int64_t>(window_lengths_.size());
  if (doc < window_begin_ || doc >= window_end) share_lengths(doc);
  const auto k = static_cast<size_t>(doc - window_begin_);
  out.ids.clear();
  out.labels.clear();
  out.where.clear();
  out.skimmed = false;
  WindowDocument& d = window_docs_[k];
  if (window_lengths_[k] == kUnencodable) fail_job_wide(unencodable_error(doc, d));
  if (window_lengths_[k] == kBadRecord) {
    if (d.error) {  // read here: its own error
      try {
        std::rethrow_exception(d.error);
      } catch (const BadRecordError& e) {
        return skip_bad_record(d.error, e.what());
      }
    }
    // Self-contained: the reading rank's own line may not be printed before the job ends.
    const std::string message = file_->path() + ": document " + std::to_string(own_docs_[doc]) +
                                " (from 0, in file order) is a bad record, read by data-parallel "
                                "rank " +
                                std::to_string((doc - window_begin_) % dp_ranks_);
    return skip_bad_record(std::make_exception_ptr(BadRecordError(message)), message);
  }
  out.length = static_cast<size_t>(window_lengths_[k]);
  if ((doc - window_begin_) % dp_ranks_ == dp_rank_) {  // tokenized here
    out.ids = std::move(d.tokens.ids);
    out.labels = std::move(d.tokens.labels);
    out.where = std::move(d.where);
    return true;
  }
  // Another rank's: read again (deterministic) only if this rank needs its tokens.
  const std::shared_ptr<const DocumentFile> file = file_;
  const auto index = static_cast<size_t>(own_docs_[doc]);
  out.where = file_->path() + ": document " + std::to_string(index) + " (from 0, in file order)";
  const Tokenizer* tok = &tok_;
  const ChatTemplate* chat = chat_template();
  const DataMode mode = options_.mode;
  const bool parse_special = options_.data.parse_special;
  const int32_t eos = eos_;
  const std::shared_ptr<std::atomic<int64_t>> tokenized = tokenized_;
  out.unread = std::make_shared<const UnreadDocument>([=] {
    Record r = file->record(index, mode);
    if (r.kind != Record::Kind::ids) ++*tokenized;
    return document_tokens(std::move(r), *tok, chat, parse_special, eos);
  });
  return true;
}

std::string BatchProducer::unencodable_error(int64_t doc, const WindowDocument& d) const {
  try {
    if (d.error) std::rethrow_exception(d.error);
    document_tokens(read_record(doc), tok_, chat_template(), options_.data.parse_special, eos_);
  } catch (const Error& e) {
    return e.what();
  }
  return file_->path() + ": document " + std::to_string(own_docs_[doc]) +
         " (from 0, in file order) did not encode on data-parallel rank " +
         std::to_string((doc - window_begin_) % dp_ranks_) + " but encodes on rank " +
         std::to_string(dp_rank_);
}

void BatchProducer::read_ids(Document& d) {
  if (!d.unread) return;
  d.ids = d.unread->tokens().ids;
  d.labels = d.unread->tokens().labels;
  TITAN_CHECK(d.ids.size() == d.length, file_->path(), ": a document gave ", d.ids.size(),
              " tokens here and ", d.length, " to the rank that measured it");
  d.unread.reset();
}

bool BatchProducer::load_document() {
  for (;;) {
    if (options_.epochs > 0 && state_.epoch >= options_.epochs) return false;
    open_file();
    if (state_.doc >= static_cast<int64_t>(own_docs_.size())) {
      finish_file();
      state_.doc = 0;
      state_.doc_offset = 0;
      if (++state_.file == static_cast<int64_t>(files_.size())) {
        state_.file = 0;
        ++state_.epoch;
        // The first pass may have started mid-epoch; two passes without a document mean none.
        TITAN_CHECK(++empty_epochs_ <= 2, "loader: rank ", options_.rank, " of ",
                    options_.world_size, " gets no documents from the dataset (", files_.size(),
                    " files)");
      }
      continue;
    }
    // A skimmed conversation is a row whatever its tokens; an empty document is skipped.
    if (read_document(state_.doc, doc_) && (doc_.skimmed || doc_.length > 0)) {
      doc_loaded_ = true;
      empty_epochs_ = 0;
      return true;
    }
    ++state_.doc;
  }
}

void BatchProducer::advance(size_t n) {
  state_.doc_offset += static_cast<int64_t>(n);
  if (static_cast<size_t>(state_.doc_offset) == doc_.length) {
    doc_loaded_ = false;
    ++state_.doc;
    state_.doc_offset = 0;
  }
}

bool BatchProducer::pack_row(int32_t* ids, int32_t* labels) {
  if (!own_batch_) return skip_packed_row(ids, labels);
  // After another rank's rows: read the carry they left unread.
  if (unread_carry_) {
    state_.carry = unread_carry_->read();
    unread_carry_.reset();
  }
  const auto S = static_cast<size_t>(options_.seq_len);
  std::vector<int32_t>& window = state_.carry;
  while (window.size() < S + 1) {
    if (!doc_loaded_ && !load_document()) return false;
    const auto offset = static_cast<size_t>(state_.doc_offset);
    const size_t n = std::min(S + 1 - window.size(), doc_.length - offset);
    read_ids(doc_);  // another rank's text document reaching into this rank's row
    if (doc_.token_file) {
      read_with_eos(*doc_.token_file, doc_.file_doc, offset, offset + n, eos_, window);
    } else {
      window.insert(window.end(), doc_.ids.begin() + offset, doc_.ids.begin() + offset + n);
    }
    advance(n);
  }
  std::copy(window.begin(), window.end() - 1, ids);
  std::copy(window.begin() + 1, window.end(), labels);
  // The last token is only a target here: it is the first input of the next window.
  window.erase(window.begin(), window.end() - 1);
  return true;
}

bool BatchProducer::skip_packed_row(int32_t* ids, int32_t* labels) {
  const auto S = static_cast<size_t>(options_.seq_len);
  if (!unread_carry_) {
    unread_carry_.emplace(std::move(state_.carry));
    state_.carry.clear();
  }
  CarriedTokens& window = *unread_carry_;
  while (window.size() < S + 1) {
    if (!doc_loaded_ && !load_document()) return false;  // the carry: the partial window
    const auto offset = static_cast<size_t>(state_.doc_offset);
    const size_t n = std::min(S + 1 - window.size(), doc_.length - offset);
    if (doc_.token_file) {
      window.append_span(doc_.token_file, doc_.file_doc, offset, offset + n, eos_);
    } else if (doc_.unread) {
      window.append_document(doc_.unread, offset, offset + n);
    } else {
      window.append(doc_.ids.data() + offset, n);
    }
    advance(n);
  }
  window.keep_last(1);  // the next window's first token, as pack_row keeps it
  std::fill(ids, ids + S, pad_);
  std::fill(labels, labels + S, kIgnoreLabel);
  return true;
}

size_t BatchProducer::chat_length(bool& cut) const {
  const auto S = static_cast<size_t>(options_.seq_len);
  const size_t n = doc_.length;  // its ids may be unread (another rank's: read_shared_document)
  cut = n > S + 1;
  if (!cut) return n;
  TITAN_CHECK(options_.truncate_long, doc_.where, ": the conversation has ", n,
              " tokens, more than seq_len + 1 = ", S + 1, " (", options_.long_conversation_hint,
              ")");
  return S + 1;
}

bool BatchProducer::chat_row(int32_t* ids, int32_t* labels) {
  if (!load_document()) return false;
  doc_loaded_ = false;
  ++state_.doc;
  const auto S = static_cast<size_t>(options_.seq_len);
  if (doc_.skimmed) {  // another rank's row: left empty
    std::fill(ids, ids + S, pad_);
    std::fill(labels, labels + S, kIgnoreLabel);
    return true;
  }
  // The window is the conversation: its tokens but the last are inputs, its labels but the first
  // are targets.
  bool cut = false;
  const size_t n = chat_length(cut);
  if (cut) ++state_.truncated;
  const size_t inputs = n > 0 ? n - 1 : 0;
  std::copy(doc_.ids.begin(), doc_.ids.begin() + inputs, ids);
  std::copy(doc_.labels.begin() + 1, doc_.labels.begin() + 1 + inputs, labels);
  std::fill(ids + inputs, ids + S, pad_);
  std::fill(labels + inputs, labels + S, kIgnoreLabel);
  return true;
}

bool BatchProducer::packed_chat_row(int32_t* ids, int32_t* labels, int32_t* starts) {
  const auto S = static_cast<size_t>(options_.seq_len);
  size_t at = 0;
  // Each conversation is cut as in a row of its own (inputs all its tokens but the last), so the
  // row holds what those rows hold but their padding. One that does not fit stays loaded for the
  // next row (the state still points at it: a resume reads it again).
  while (at < S && (doc_loaded_ || load_document())) {
    bool cut = false;
    const size_t n = chat_length(cut);
    const size_t inputs = n > 0 ? n - 1 : 0;
    if (inputs > S - at) break;
    if (own_batch_) {
      read_ids(doc_);  // another rank's conversation in this rank's row
      std::copy(doc_.ids.begin(), doc_.ids.begin() + inputs, ids + at);
      std::copy(doc_.labels.begin() + 1, doc_.labels.begin() + 1 + inputs, labels + at);
    } else {  // another rank's row: left empty, as skip_packed_row leaves one
      std::fill(ids + at, ids + at + inputs, pad_);
      std::fill(labels + at, labels + at + inputs, kIgnoreLabel);
    }
    std::fill(starts + at, starts + at + inputs, static_cast<int32_t>(at));
    at += inputs;
    if (cut && own_batch_) ++state_.truncated;  // counted by the rank whose row it is
    doc_loaded_ = false;
    ++state_.doc;
  }
  if (at == 0) return false;  // the data ended
  std::fill(ids + at, ids + S, pad_);
  std::fill(labels + at, labels + S, kIgnoreLabel);
  std::fill(starts + at, starts + S, static_cast<int32_t>(at));
  return true;
}

bool BatchProducer::next_row(int32_t* ids, int32_t* labels) {
  return options_.mode == DataMode::chat ? chat_row(ids, labels) : pack_row(ids, labels);
}

bool BatchProducer::next(Batch& batch) {
  const int64_t B = options_.batch_size, S = options_.seq_len;
  batch.batch_size = B;
  batch.seq_len = S;
  batch.input_ids.resize(static_cast<size_t>(B * S));
  batch.labels.resize(static_cast<size_t>(B * S));
  const bool packed = options_.mode == DataMode::chat && options_.pack_conversations;
  batch.segment_start.assign(packed ? static_cast<size_t>(B * S) : 0, 0);
  const LoaderOptions::Share& share = options_.share;
  const int64_t at = state_.batches % share.step_batches;
  own_batch_ = at >= share.first && at < share.first + share.count;
  batch.own = own_batch_;
  for (int64_t b = 0; b < B; ++b) {
    const bool filled =
        packed ? packed_chat_row(batch.input_ids.data() + b * S, batch.labels.data() + b * S,
                                 batch.segment_start.data() + b * S)
               : next_row(batch.input_ids.data() + b * S, batch.labels.data() + b * S);
    if (filled) continue;
    // The data ended. Pre-training drops the partial batch; chat data keeps it, the rows left
    // empty (padding, nothing scored), so a pass scores every conversation once, as Transformers'
    // evaluation does (drop_last false).
    if (b == 0 || options_.mode != DataMode::chat) return false;
    std::fill(batch.input_ids.begin() + b * S, batch.input_ids.end(), pad_);
    std::fill(batch.labels.begin() + b * S, batch.labels.end(), kIgnoreLabel);
    break;
  }
  ++state_.batches;
  return true;
}

}  // namespace titan
