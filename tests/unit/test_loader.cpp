// The loader: the packing convention, fixed shapes and the dropped last batch, exact resume from a
// saved state (mid-document, across epochs), disjoint ranks that cover the data, a data-parallel
// share that tokenizes only its own chat rows, reads only its own packed rows of token files and
// tokenizes about its share of packed text, chat masking, and one clear line for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "test_dataset_util.h"
#include "test_tokenizer_python.h"
#include "titan/data/byte_level.h"
#include "titan/data/dataset_chat.h"
#include "titan/data/dataset_read.h"
#include "titan/data/dataset_tokenize.h"
#include "titan/data/loader.h"
#include "titan/data/loader_producer.h"
#include "titan/data/token_file.h"

namespace titan {
namespace {

using nlohmann::json;
using test::error_of;
using test::ScratchDir;
using test::write_text;

std::vector<Batch> drain(DataLoader& loader, size_t limit = SIZE_MAX) {
  std::vector<Batch> out;
  while (out.size() < limit) {
    std::optional<Batch> b = loader.next_batch();
    if (!b) break;
    out.push_back(std::move(*b));
  }
  return out;
}

std::string prose(int i) {
  std::string s = "Document " + std::to_string(i) + ":";
  for (int w = 0; w < 3 + (i * 7) % 23; ++w) s += " word" + std::to_string((i * 31 + w) % 97);
  return s;
}

// The ranks of one data-parallel group as threads of this process: sum() returns once every rank
// has called it, with the values of all summed (LoaderOptions::sum_over_ranks).
class ThreadRanks {
 public:
  explicit ThreadRanks(int n) : n_(n) {}
  void sum(double* values, int64_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (arrived_ == 0) {
      total_.assign(values, values + count);
    } else {
      EXPECT_EQ(total_.size(), static_cast<size_t>(count));  // every rank sums the same window
      for (int64_t i = 0; i < count && i < static_cast<int64_t>(total_.size()); ++i) {
        total_[i] += values[i];
      }
    }
    if (++arrived_ == n_) {
      arrived_ = 0;
      result_ = total_;
      ++generation_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return generation_ != generation; });
    }
    std::copy(result_.begin(), result_.end(), values);
  }

 private:
  const int n_;
  std::mutex mutex_;
  std::condition_variable done_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<double> total_, result_;
};

// A rank's share of each step's batches and its sums over the group's ranks (none: one process).
struct RankShare {
  LoaderOptions::Share share;
  std::function<void(double*, int64_t)> sum_over_ranks;
  LoaderOptions applied_to(LoaderOptions options) const {
    options.share = share;
    options.sum_over_ranks = sum_over_ranks;
    return options;
  }
};

// Runs the n ranks of a data-parallel group at once, each on a thread: rank r the r-th run of
// `per_rank` batches of each step (the trainer's share), the ranks summing over a ThreadRanks.
template <typename Run>
std::vector<Run> run_ranks(int n, int64_t per_rank,
                           const std::function<Run(const RankShare&)>& run) {
  ThreadRanks group(n);
  std::vector<Run> runs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const RankShare rank{{n * per_rank, r * per_rank, per_rank},
                           [&group](double* values, int64_t count) { group.sum(values, count); }};
      runs[static_cast<size_t>(r)] = run(rank);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// One rank's walk of a producer (a whole one: RankShare{}): its batches, the state after each and
// at the end, and the records it tokenized (reading the states included).
struct RankRun {
  std::vector<Batch> batches;
  std::vector<LoaderState> states;  // after each batch
  LoaderState end;
  int64_t tokenized = 0;
};
RankRun walk(const LoaderOptions& options, const Tokenizer& tok,
             const std::vector<std::string>& files, const RankShare& rank,
             const std::optional<LoaderState>& from) {
  const LoaderOptions with = rank.applied_to(options);  // the producer keeps a reference
  BatchProducer producer(with, tok, files, from);
  RankRun r;
  for (Batch b; producer.next(b);) {
    r.batches.push_back(b);
    r.states.push_back(producer.state());
  }
  r.end = producer.state();
  r.tokenized = producer.tokenized();
  return r;
}

// A rank's walk from batch `from` on against the one process's `whole`: its own batches (by
// `layout`) the whole's, the others padding, the rows' segment starts and the states after each
// batch and at the end the whole's (as `comparable` shows them).
void check_rank_walk(const RankRun& whole, const RankRun& share, size_t from,
                     const LoaderOptions::Share& layout, int32_t pad_id,
                     const std::function<LoaderState(LoaderState)>& comparable) {
  ASSERT_EQ(share.batches.size() + from, whole.batches.size());
  for (size_t i = 0; i < share.batches.size(); ++i) {
    const Batch& b = share.batches[i];
    const Batch& w = whole.batches[from + i];
    const auto at = static_cast<int64_t>((from + i) % static_cast<size_t>(layout.step_batches));
    ASSERT_EQ(b.own, at >= layout.first && at < layout.first + layout.count) << i;
    EXPECT_EQ(comparable(share.states[i]), comparable(whole.states[from + i])) << i;
    EXPECT_EQ(b.segment_start, w.segment_start) << i;
    if (b.own) {
      EXPECT_EQ(b.input_ids, w.input_ids) << i;
      EXPECT_EQ(b.labels, w.labels) << i;
    } else {
      EXPECT_EQ(b.input_ids, std::vector<int32_t>(b.input_ids.size(), pad_id)) << i;
      EXPECT_EQ(b.labels, std::vector<int32_t>(b.labels.size(), kIgnoreLabel)) << i;
    }
  }
  EXPECT_EQ(comparable(share.end), comparable(whole.end));
}

// Where a rank's walk stopped: after how many batches, with what error.
struct RankStop {
  size_t batches = 0;
  std::string error;
};
RankStop walk_to_error(const LoaderOptions& options, const Tokenizer& tok,
                       const std::vector<std::string>& files, const RankShare& rank) {
  const LoaderOptions with = rank.applied_to(options);  // the producer keeps a reference
  BatchProducer producer(with, tok, files, std::nullopt);
  RankStop stop;
  stop.error = error_of([&] {
    for (Batch b; producer.next(b);) ++stop.batches;
  });
  return stop;
}

// One chat JSONL line: a user's question and the assistant's reply.
std::string chat_line(const std::string& question, const std::string& reply) {
  return json{{"messages",
               {{{"role", "user"}, {"content", question}},
                {{"role", "assistant"}, {"content", reply}}}}}
             .dump() +
         "\n";
}

// One pass over a chat file with Qwen3's template: batch_size rows of seq_len.
LoaderOptions chat_options(const std::string& path, int64_t batch_size, int64_t seq_len) {
  LoaderOptions o;
  o.data.paths = {path};
  o.mode = DataMode::chat;
  o.chat_template = ChatTemplate(ChatTemplateKind::qwen3);
  o.epochs = 1;
  o.batch_size = batch_size;
  o.seq_len = seq_len;
  return o;
}

// torchtitan's rows: window k is stream[k * S, k * S + S + 1), inputs its first S tokens, labels
// its last S; consecutive windows share one token, so every target of the stream is scored once.
// Text documents are encoded as HF's tokenizer(text) does, with the post-processor's special
// tokens (none for Qwen, <|begin_of_text|> first for Llama 3).
void check_packing(const Tokenizer& tok) {
  const ScratchDir dir("pack");
  std::string jsonl;
  std::vector<int32_t> stream;
  for (int i = 0; i < 40; ++i) {
    jsonl += json{{"text", prose(i)}}.dump() + "\n";
    const std::vector<int32_t> ids = tok.encode_with_special_tokens(prose(i));
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(tok.eos_id());
  }
  write_text(dir / "a.jsonl", jsonl);
  LoaderOptions o;
  o.data.paths = {dir / "a.jsonl"};
  o.shuffle = false;
  o.epochs = 1;
  o.seq_len = 16;
  constexpr size_t S = 16;
  // The batch that cannot be filled is dropped.
  const size_t rows = (stream.size() - 1) / S;
  o.batch_size = 3;
  while (rows % o.batch_size == 0) ++o.batch_size;  // leave a short last batch to drop
  const auto B = static_cast<size_t>(o.batch_size);
  DataLoader loader(o, tok);
  const std::vector<Batch> batches = drain(loader);
  ASSERT_EQ(batches.size(), rows / B);
  for (size_t b = 0; b < batches.size(); ++b) {
    ASSERT_EQ(batches[b].batch_size, o.batch_size);
    ASSERT_EQ(batches[b].seq_len, 16);
    ASSERT_EQ(batches[b].input_ids.size(), B * S);
    ASSERT_EQ(batches[b].labels.size(), B * S);
    for (size_t r = 0; r < B; ++r) {
      const size_t k = b * B + r;
      const std::vector<int32_t> window(stream.begin() + k * S, stream.begin() + k * S + S + 1);
      const std::vector<int32_t> inputs(batches[b].input_ids.begin() + r * S,
                                        batches[b].input_ids.begin() + (r + 1) * S);
      const std::vector<int32_t> labels(batches[b].labels.begin() + r * S,
                                        batches[b].labels.begin() + (r + 1) * S);
      EXPECT_EQ(inputs, std::vector<int32_t>(window.begin(), window.end() - 1)) << "row " << k;
      EXPECT_EQ(labels, std::vector<int32_t>(window.begin() + 1, window.end())) << "row " << k;
    }
  }
  EXPECT_FALSE(loader.next_batch());
  EXPECT_FALSE(loader.next_batch());
}

const Tokenizer& llama3_style_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(test::env_or_empty("TITAN_SOURCE_DIR") +
                                               "/tests/fixtures/llama3-style-tokenizer");
  return tok;
}

TEST(Loader, PacksDocumentsWithEosIntoTorchtitanWindows) {
  check_packing(test::trained_tokenizer());
  const Tokenizer& llama = llama3_style_tokenizer();
  const int32_t bos = llama.token_to_id("<|begin_of_text|>");
  ASSERT_GE(bos, 0);
  ASSERT_EQ(llama.encode_with_special_tokens(prose(0)).front(), bos);
  check_packing(llama);
}

// titan tokenize --bin writes the ids the loader would make of the same text documents.
TEST(Loader, TokenFilesHoldTheSpecialTokensToo) {
  const ScratchDir dir("bin_bos");
  const Tokenizer& tok = llama3_style_tokenizer();
  write_text(dir / "a.jsonl", json{{"text", prose(1)}}.dump() + "\n" + json{{"text", ""}}.dump() +
                                  "\n" + json{{"text", prose(2)}}.dump() + "\n");
  DatasetOptions data;
  data.paths = {dir / "a.jsonl"};
  tokenize_to_token_file(tok, data, dir / "a.bin");
  const auto bin = TokenFileReader::open(dir / "a.bin");
  ASSERT_EQ(bin->n_docs(), 3u);
  const auto doc = [&](size_t i) {
    std::vector<int32_t> ids;
    bin->read_doc(i, ids);
    return ids;
  };
  EXPECT_EQ(doc(0), tok.encode_with_special_tokens(prose(1)));
  EXPECT_TRUE(doc(1).empty());  // an empty document stays empty: no lone BOS
  EXPECT_EQ(doc(2), tok.encode_with_special_tokens(prose(2)));
}

// A dataset in four formats, three files of documents and a token file.
LoaderOptions mixed_dataset(const ScratchDir& dir) {
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl, text;
  for (int i = 0; i < 23; ++i) jsonl += json{{"text", prose(i)}}.dump() + "\n";
  for (int i = 100; i < 111; ++i) text += prose(i) + "\n\n";
  write_text(dir / "d/a.jsonl", jsonl);
  test::write_gzip(dir / "d/b.txt.gz", text);
  std::string ids;
  for (int i = 0; i < 9; ++i) ids += json{{"ids", tok.encode(prose(200 + i))}}.dump() + "\n";
  write_text(dir / "ids.jsonl", ids);
  DatasetOptions bin;
  bin.paths = {dir / "ids.jsonl"};
  tokenize_to_token_file(tok, bin, dir / "d/c.bin");
  write_text(dir / "d/e.json",
             json::array({{{"text", prose(300)}}, {{"text", prose(301)}}}).dump());
  LoaderOptions o;
  o.data.paths = {dir / "d"};
  o.seed = 1234;
  o.batch_size = 2;
  o.seq_len = 24;
  return o;
}

TEST(Loader, ResumesExactlyMidEpochAndAcrossEpochs) {
  const ScratchDir dir("resume");
  const Tokenizer& tok = test::trained_tokenizer();
  for (const int world : {1, 2}) {
    LoaderOptions o = mixed_dataset(dir);
    o.world_size = world;
    o.rank = world - 1;
    std::vector<Batch> full;
    std::vector<LoaderState> states;
    {
      DataLoader loader(o, tok);
      EXPECT_EQ(loader.state().batches, 0);
      for (int i = 0; i < 200; ++i) {
        full.push_back(*loader.next_batch());
        states.push_back(loader.state());
      }
    }
    // Resume points: mid-document, exactly after an epoch boundary, and late in the run.
    std::set<size_t> points = {0, 199};
    for (size_t i = 0; i + 1 < states.size(); ++i) {
      if (states[i].doc_offset > 0 && points.size() < 4) points.insert(i);
      if (states[i].epoch == 0 && states[i + 1].epoch == 1) points.insert(i + 1);
      if (states[i].epoch == 1 && states[i + 1].epoch == 2) points.insert(i);
    }
    ASSERT_GE(states.back().epoch, 2) << "the run should cross two epoch boundaries";
    ASSERT_GE(points.size(), 5u);
    for (const size_t p : points) {
      const LoaderState saved = LoaderState::from_json(states[p].to_json());
      ASSERT_EQ(saved, states[p]);
      DataLoader resumed(o, tok, saved);
      EXPECT_EQ(resumed.state(), states[p]);
      for (size_t i = p + 1; i < full.size(); ++i) {
        const std::optional<Batch> b = resumed.next_batch();
        ASSERT_TRUE(b);
        ASSERT_EQ(b->input_ids, full[i].input_ids)
            << "world " << world << ", resumed after batch " << p << ", batch " << i;
        ASSERT_EQ(b->labels, full[i].labels);
        ASSERT_EQ(resumed.state(), states[i]);
      }
    }
  }
}

TEST(Loader, EpochsAreShuffledDifferentlyAndSeedsDiffer) {
  const ScratchDir dir("shuffle");
  const Tokenizer& tok = test::trained_tokenizer();
  LoaderOptions o = mixed_dataset(dir);
  o.epochs = 2;
  o.batch_size = 1;
  DataLoader a(o, tok);
  const std::vector<Batch> run = drain(a);
  o.seed = 4321;
  DataLoader b(o, tok);
  const std::vector<Batch> other = drain(b);
  ASSERT_FALSE(run.empty());
  EXPECT_NE(run.front().input_ids, other.front().input_ids);
  // The two epochs hold the same tokens in different orders.
  std::vector<int32_t> first, second;
  const size_t half = run.size() / 2;
  for (size_t i = 0; i < run.size(); ++i) {
    (i < half ? first : second).push_back(run[i].input_ids.front());
  }
  EXPECT_NE(first, std::vector<int32_t>(second.begin(), second.begin() + first.size()));
}

// Pre-training ranks: each document is one distinct id repeated, so the ids a rank's stream holds
// name its documents.
TEST(Loader, RanksSeeDisjointDocumentsThatCoverTheData) {
  const ScratchDir dir("ranks");
  const Tokenizer& tok = test::trained_tokenizer();
  constexpr int kDocs = 30, kLen = 7, kWorld = 3;
  std::string jsonl;
  for (int d = 0; d < kDocs; ++d) {
    jsonl += json{{"ids", std::vector<int32_t>(kLen, 300 + d)}}.dump() + "\n";
  }
  write_text(dir / "a.jsonl", jsonl);
  std::map<int32_t, int> owner;
  for (int rank = 0; rank < kWorld; ++rank) {
    LoaderOptions o;
    o.data.paths = {dir / "a.jsonl"};
    o.seed = 7;
    o.epochs = 1;
    o.batch_size = 1;
    o.seq_len = kLen + 2;
    o.rank = rank;
    o.world_size = kWorld;
    DataLoader loader(o, tok);
    const std::vector<Batch> batches = drain(loader);
    // 10 documents of 8 tokens with EOS: windows of 10 sharing a token, (80 - 1) / 9 = 8 rows,
    // the last document cut short.
    ASSERT_EQ(batches.size(), 8u) << "rank " << rank;
    for (const Batch& b : batches) {
      std::vector<int32_t> ids = b.input_ids;
      ids.insert(ids.end(), b.labels.begin(), b.labels.end());
      for (const int32_t id : ids) {
        if (id == tok.eos_id()) continue;
        const auto [it, fresh] = owner.emplace(id, rank);
        EXPECT_EQ(it->second, rank) << "document " << id - 300 << " seen by two ranks";
      }
    }
  }
  EXPECT_EQ(owner.size(), static_cast<size_t>(kDocs));
}

// Byte offsets in the template text where each token of ids starts.
std::vector<size_t> token_starts(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<size_t> starts;
  size_t pos = 0;
  for (const int32_t id : ids) {
    starts.push_back(pos);
    std::string raw;
    const std::string token = tok.id_to_token(id);
    pos += byte_level_decode(token, raw) ? raw.size() : token.size();
  }
  return starts;
}

std::vector<std::vector<ChatMessage>> qwen3_conversations() {
  return {
      {{"system", "You are terse.", ""},
       {"user", "What is 2+2?", ""},
       {"assistant", "4", ""},
       {"user", "And 3+3?", ""},
       {"assistant", "<think>\nadd\n</think>\n\n6", ""}},
      {{"user", "Hi", ""}, {"assistant", "\n\n  Hello there!", "greet back"}},
      {{"user", "Weather?", ""},
       {"assistant", "Let me check.", ""},
       {"tool", "{\"t\": 20}", ""},
       {"assistant", "It is 20 degrees.", ""}},
  };
}

// Qwen2.5 renders no reasoning_content (its content keeps any <think> block as text).
std::vector<std::vector<ChatMessage>> without_reasoning(std::vector<std::vector<ChatMessage>> all) {
  for (auto& messages : all) {
    for (ChatMessage& m : messages) m.reasoning_content.clear();
  }
  return all;
}

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  return tok;
}

// Llama 3.1 renders no tool turns and no reasoning; its replies are trimmed.
std::vector<std::vector<ChatMessage>> llama_conversations() {
  return {
      {{"system", "You are terse.", ""},
       {"user", "What is 2+2?", ""},
       {"assistant", "4", ""},
       {"user", "And 3+3?", ""},
       {"assistant", "  6, which is 3 + 3.\n\n", ""}},
      {{"user", "Hi", ""}, {"assistant", "Hello there! \xF0\x9F\x99\x82", ""}},
      {{"assistant", "", ""}, {"user", "nothing?", ""}, {"assistant", "Nothing.", ""}},
  };
}

// Labels are the ids of the tokens starting inside a reply: from after the assistant header
// through the token that closes the turn.
void check_chat_mask(const Tokenizer& tok, const ChatTemplate& chat,
                     const std::vector<std::vector<ChatMessage>>& conversations,
                     const std::string& header, const std::string& end) {
  for (const std::vector<ChatMessage>& messages : conversations) {
    const std::string text = chat.render(messages, false, true);
    std::vector<std::pair<size_t, size_t>> replies;
    for (size_t at = text.find(header); at != std::string::npos; at = text.find(header, at + 1)) {
      replies.emplace_back(at + header.size(), text.find(end, at) + end.size());
    }
    ASSERT_FALSE(replies.empty());
    std::vector<int32_t> ids, labels;
    encode_chat(tok, chat, messages, ids, labels);
    ASSERT_EQ(ids, tok.encode(text));
    ASSERT_EQ(labels.size(), ids.size());
    const std::vector<size_t> starts = token_starts(tok, ids);
    size_t n_labelled = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      bool in_reply = false;
      for (const auto& [b, e] : replies) in_reply |= starts[t] >= b && starts[t] < e;
      EXPECT_EQ(labels[t], in_reply ? ids[t] : kIgnoreLabel)
          << "token " << t << " at byte " << starts[t] << " of:\n"
          << text;
      n_labelled += labels[t] != kIgnoreLabel;
    }
    EXPECT_GT(n_labelled, replies.size());
  }
}

TEST(LoaderChat, LabelsExactlyTheAssistantReplies) {
  const ChatTemplate qwen3(ChatTemplateKind::qwen3);
  for (const Tokenizer* tok : {&test::trained_tokenizer(), &qwen3_tokenizer()}) {
    check_chat_mask(*tok, qwen3, qwen3_conversations(), "<|im_start|>assistant\n", "<|im_end|>");
    check_chat_mask(*tok, ChatTemplate(ChatTemplateKind::qwen2_5),
                    without_reasoning(qwen3_conversations()), "<|im_start|>assistant\n",
                    "<|im_end|>");
  }
}

// Llama 3 rows: the reply after "<|start_header_id|>assistant<|end_header_id|>\n\n" through its
// <|eot_id|>, on the Llama-3-style tokenizer (tests/fixtures) with its own Llama 3.1 template.
TEST(LoaderChat, LabelsTheLlama3AssistantReplies) {
  const std::string dir =
      test::env_or_empty("TITAN_SOURCE_DIR") + "/tests/fixtures/llama3-style-tokenizer";
  const Tokenizer tok = Tokenizer::load(dir);
  const ChatTemplate llama31 = ChatTemplate::load(dir);
  ASSERT_EQ(llama31.kind(), ChatTemplateKind::llama3_1);
  const std::string header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  check_chat_mask(tok, llama31, llama_conversations(), header, "<|eot_id|>");
  check_chat_mask(tok, ChatTemplate(ChatTemplateKind::llama3, "<|begin_of_text|>"),
                  llama_conversations(), header, "<|eot_id|>");
  // One BOS (the template's), the system turn unlabelled, the reply and its <|eot_id|> labelled.
  std::vector<int32_t> ids, labels;
  encode_chat(tok, llama31, {{"user", "Hi", ""}, {"assistant", "Hello there!", ""}}, ids, labels);
  const int32_t bos = tok.token_to_id("<|begin_of_text|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1);
  EXPECT_EQ(ids.front(), bos);
  std::vector<int32_t> labelled;
  for (const int32_t l : labels) {
    if (l != kIgnoreLabel) labelled.push_back(l);
  }
  std::vector<int32_t> want = tok.encode("Hello there!");
  want.push_back(tok.token_to_id("<|eot_id|>"));
  EXPECT_EQ(labelled, want);
  // A loader in chat mode without a template is refused.
  LoaderOptions o;
  o.data.paths = {dir + "/tokenizer_config.json"};
  o.mode = DataMode::chat;
  EXPECT_NE(error_of([&] { DataLoader loader(o, tok); }).find("needs the chat template"),
            std::string::npos);
}

TEST(LoaderChat, OneConversationPerRowPaddedAndShardedByRank) {
  const ScratchDir dir("chat");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  constexpr int kConversations = 11;
  for (int i = 0; i < kConversations; ++i) {
    jsonl += chat_line("question " + std::to_string(i), prose(i));
  }
  write_text(dir / "chat.jsonl", jsonl);
  std::set<std::vector<int32_t>> seen;
  for (int rank = 0; rank < 2; ++rank) {
    LoaderOptions o = chat_options(dir / "chat.jsonl", 1, 128);
    o.rank = rank;
    o.world_size = 2;
    DataLoader loader(o, tok);
    const std::vector<Batch> batches = drain(loader);
    EXPECT_EQ(batches.size(), rank == 0 ? 6u : 5u);
    for (const Batch& b : batches) {
      ASSERT_EQ(b.input_ids.size(), 128u);
      size_t n = 128;
      while (n > 0 && b.input_ids[n - 1] == tok.pad_id()) --n;
      ASSERT_LT(n, 128u) << "every conversation should be padded";
      const std::vector<int32_t> ids(b.input_ids.begin(), b.input_ids.begin() + n);
      for (size_t s = n; s < 128; ++s) EXPECT_EQ(b.labels[s], kIgnoreLabel);
      EXPECT_TRUE(seen.insert(ids).second) << "a conversation seen twice";
      // The row is one whole conversation as a window: inputs all its tokens but the last,
      // labels its mask but the first.
      const std::string text = tok.decode(ids);
      bool matched = false;
      for (int i = 0; i < kConversations && !matched; ++i) {
        const std::vector<ChatMessage> m = {{"user", "question " + std::to_string(i), ""},
                                            {"assistant", prose(i), ""}};
        std::vector<int32_t> want_ids, want_labels;
        encode_chat(tok, *o.chat_template, m, want_ids, want_labels);
        if (std::vector<int32_t>(want_ids.begin(), want_ids.end() - 1) != ids) continue;
        matched = true;
        EXPECT_EQ(std::vector<int32_t>(b.labels.begin(), b.labels.begin() + n),
                  std::vector<int32_t>(want_labels.begin() + 1, want_labels.end()));
      }
      EXPECT_TRUE(matched) << text;
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kConversations));
}

// A data-parallel rank's share of one stream of batches (LoaderOptions::share, the trainer's 2
// ranks x 2 micro-batches): the other ranks' chat rows are read -- a bad record is skipped as in
// the whole stream -- but not tokenized, and left empty; its own batches and every position are
// the whole stream's, so a state saved by one share resumes on another (here 4 ranks).
TEST(LoaderChat, ARankTokenizesOnlyItsOwnRowsAndResumesOnAnyShare) {
  const ScratchDir dir("chat_share");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  for (int i = 0; i < 13; ++i) {
    jsonl += i == 4 ? "[1]\n" : chat_line("question " + std::to_string(i), prose(i));
  }
  const std::string path = dir / "chat.jsonl";
  write_text(path, jsonl);
  LoaderOptions o = chat_options(path, 1, 128);
  o.data.skip_bad_records = true;
  o.warn = [](const std::string&) {};
  struct Run {
    std::vector<Batch> batches;
    std::vector<LoaderState> states;  // after each batch
    int64_t tokenized = 0;
  };
  const auto run = [&](LoaderOptions::Share share, const std::optional<LoaderState>& from) {
    LoaderOptions options = o;
    options.share = share;
    BatchProducer producer(options, tok, {path}, from);
    Run r;
    for (Batch b; producer.next(b);) {
      r.batches.push_back(b);
      r.states.push_back(producer.state());
    }
    r.tokenized = producer.tokenized();
    return r;
  };
  const Run whole = run({}, std::nullopt);
  ASSERT_EQ(whole.batches.size(), 12u);  // the bad record skipped
  EXPECT_EQ(whole.tokenized, 12);
  const auto same_rows = [](const Batch& a, const Batch& b) {
    return a.input_ids == b.input_ids && a.labels == b.labels;
  };
  for (int64_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const Run share = run({4, 2 * rank, 2}, std::nullopt);
    ASSERT_EQ(share.batches.size(), whole.batches.size());
    int64_t own = 0;
    for (size_t i = 0; i < whole.batches.size(); ++i) {
      const Batch& b = share.batches[i];
      EXPECT_EQ(b.own, static_cast<int64_t>(i % 4) / 2 == rank) << i;
      EXPECT_EQ(share.states[i], whole.states[i]) << i;
      if (b.own) {
        ++own;
        EXPECT_TRUE(same_rows(b, whole.batches[i])) << i;
        continue;
      }
      EXPECT_TRUE(std::all_of(b.input_ids.begin(), b.input_ids.end(), [&](int32_t id) {
        return id == tok.pad_id();
      })) << i;
      EXPECT_TRUE(std::all_of(b.labels.begin(), b.labels.end(), [](int32_t l) {
        return l == kIgnoreLabel;
      })) << i;
    }
    EXPECT_EQ(own, 6);
    EXPECT_EQ(share.tokenized, own);  // its own conversations, no other
  }
  // Saved after 5 batches by rank 0 of 2, resumed by rank 1 of 4 (a micro-batch each).
  const Run saved = run({4, 0, 2}, std::nullopt);
  const Run resumed = run({4, 1, 1}, saved.states[4]);
  ASSERT_EQ(resumed.batches.size(), whole.batches.size() - 5);
  for (size_t i = 0; i < resumed.batches.size(); ++i) {
    EXPECT_EQ(resumed.batches[i].own, (5 + i) % 4 == 1) << i;
    if (resumed.batches[i].own) {
      EXPECT_TRUE(same_rows(resumed.batches[i], whole.batches[5 + i])) << i;
    }
    EXPECT_EQ(resumed.states[i], whole.states[5 + i]) << i;
  }
  EXPECT_EQ(resumed.tokenized, 2);  // batches 5 and 9

  // A conversation too long for a row (the third, in file order) stops the whole stream and the
  // rank whose row it is, not the rank that only reads past it.
  std::string long_reply;
  for (int i = 0; i < 12; ++i) long_reply += prose(i) + " ";
  std::string lines;
  for (int i = 0; i < 4; ++i) {
    lines += chat_line("question", i == 2 ? long_reply : prose(i));
  }
  write_text(path, lines);
  o.shuffle = false;
  const std::string message = path + ":3: the conversation has ";
  EXPECT_NE(error_of([&] { run({}, std::nullopt); }).find(message), std::string::npos);
  EXPECT_NE(error_of([&] { run({4, 2, 2}, std::nullopt); }).find(message), std::string::npos);
  const Run passes = run({4, 0, 2}, std::nullopt);
  EXPECT_EQ(passes.batches.size(), 4u);
  EXPECT_EQ(passes.tokenized, 2);
}

// A data-parallel rank's share of packed pre-training rows: another rank's batch of token-file
// documents is measured by the files' tables and reads no token, its own batch no more than its
// rows' tokens (TokenFileReader counts every token read; documents are read a row's stretch at a
// time; the carried token is read only when this rank's next row or a state needs it); a
// rank's own batches, every state after a batch (the carry read) and the state at the end (a
// partial window, spanning files) are the whole stream's, so a state saved by one share resumes
// on another and on one process. Two token files and a JSON Lines file, whose documents' lengths
// the ranks (threads here) share.
TEST(Loader, ARankReadsOnlyItsOwnPackedRowsOfTokenFiles) {
  const ScratchDir dir("token_share");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string text;
  for (int i = 0; i < 6; ++i) text += json{{"text", prose(300 + i)}}.dump() + "\n";
  write_text(dir / "d/text.jsonl", text);
  for (int f = 0; f < 2; ++f) {
    std::string jsonl;
    for (int i = 0; i < 17; ++i) {
      // An empty document adds nothing, not even an EOS, in a token file as in text.
      jsonl += json{{"text", i == 5 ? std::string() : prose(100 * f + i)}}.dump() + "\n";
    }
    write_text(dir / ("src" + std::to_string(f) + ".jsonl"), jsonl);
    DatasetOptions data;
    data.paths = {dir / ("src" + std::to_string(f) + ".jsonl")};
    tokenize_to_token_file(tok, data, dir / ("d/t" + std::to_string(f) + ".bin"));
  }
  LoaderOptions o;
  o.data.paths = {dir / "d"};
  o.seed = 99;
  o.batch_size = 2;
  o.seq_len = 16;
  o.epochs = 2;
  std::vector<std::string> warnings;
  o.warn = [&](const std::string& line) { warnings.push_back(line); };
  const std::vector<std::string> files = expand_data_paths(o.data.paths);
  struct Run {
    std::vector<Batch> batches;
    std::vector<LoaderState> states;  // after each batch
    LoaderState end;
    uint64_t tokens_read = 0;
  };
  const auto run = [&](const RankShare& rank, const std::optional<LoaderState>& from) {
    const LoaderOptions options = rank.applied_to(o);
    BatchProducer producer(options, tok, files, from);
    Run r;
    for (Batch b;;) {
      const uint64_t before = producer.tokens_read();
      if (!producer.next(b)) break;
      // Not one token of another rank's batch is read.
      // Not one token of another rank's batch is read; of its own, its rows' tokens (each row
      // adds S to the stream) and the token carried in, left unread by the others' rows.
      const uint64_t read = producer.tokens_read() - before;
      EXPECT_LE(read, b.own ? static_cast<uint64_t>(o.batch_size * o.seq_len + 1) : 0u)
          << r.batches.size();
      r.batches.push_back(b);
      r.states.push_back(producer.state());
    }
    r.tokens_read = producer.tokens_read();
    r.end = producer.state();
    return r;
  };
  const Run whole = run({}, std::nullopt);
  EXPECT_TRUE(warnings.empty());  // one process: nothing to say
  ASSERT_GE(whole.batches.size(), 20u);
  EXPECT_FALSE(whole.end.carry.empty());  // the dropped partial window, carried
  const auto same_rows = [](const Batch& a, const Batch& b) {
    return a.input_ids == b.input_ids && a.labels == b.labels;
  };
  const auto check_share = [&](const Run& share, const Run& reference, size_t from,
                               const LoaderOptions::Share& layout) {
    ASSERT_EQ(share.batches.size() + from, reference.batches.size());
    int64_t own = 0;
    for (size_t i = 0; i < share.batches.size(); ++i) {
      const Batch& b = share.batches[i];
      const auto at = static_cast<int64_t>((from + i) % static_cast<size_t>(layout.step_batches));
      EXPECT_EQ(b.own, at >= layout.first && at < layout.first + layout.count) << i;
      EXPECT_EQ(share.states[i], reference.states[from + i]) << i;
      if (b.own) {
        ++own;
        EXPECT_TRUE(same_rows(b, reference.batches[from + i])) << i;
        continue;
      }
      EXPECT_TRUE(std::all_of(b.input_ids.begin(), b.input_ids.end(), [&](int32_t id) {
        return id == tok.pad_id();
      })) << i;
      EXPECT_TRUE(std::all_of(b.labels.begin(), b.labels.end(), [](int32_t l) {
        return l == kIgnoreLabel;
      })) << i;
    }
    EXPECT_GT(own, 0);
    EXPECT_EQ(share.end, reference.end);
  };
  const auto alone = [&](const RankShare& rank) { return run(rank, std::nullopt); };
  const std::vector<Run> pair = run_ranks<Run>(2, 2, alone);
  for (int64_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of 2");
    check_share(pair[rank], whole, 0, {4, 2 * rank, 2});
    EXPECT_LT(pair[rank].tokens_read, whole.tokens_read);
  }
  EXPECT_TRUE(warnings.empty());  // the text file's documents are shared too: nothing to say
  // States saved by rank 1 of 2 after another rank's batches (their carry unread until now)
  // resume on 4 ranks and on one process.
  const Run& saved = pair[1];
  for (const size_t at : {1u, 4u, 9u}) {
    SCOPED_TRACE("resumed after batch " + std::to_string(at));
    ASSERT_FALSE(saved.batches[at].own);
    const std::vector<Run> on4 =
        run_ranks<Run>(4, 1, [&](const RankShare& rank) { return run(rank, saved.states[at]); });
    for (int64_t rank = 0; rank < 4; ++rank) check_share(on4[rank], whole, at + 1, {4, rank, 1});
    const Run on1 = run({}, saved.states[at]);
    check_share(on1, whole, at + 1, {1, 0, 1});
  }
  // The DataLoader hands the states out the same way, read when asked for.
  const std::vector<std::vector<LoaderState>> loaders =
      run_ranks<std::vector<LoaderState>>(2, 1, [&](const RankShare& rank) {
        DataLoader loader(rank.applied_to(o), tok);
        std::vector<LoaderState> states;
        while (loader.next_batch()) states.push_back(loader.state());
        states.push_back(loader.state());
        EXPECT_FALSE(loader.next_batch().has_value());
        return states;
      });
  std::vector<LoaderState> expected = whole.states;
  expected.push_back(whole.end);
  for (const std::vector<LoaderState>& states : loaders) EXPECT_EQ(states, expected);
  // Token files only: no sums to make, none needed.
  LoaderOptions options = o;
  options.share = {2, 1, 1};
  options.data.paths = {dir / "d/t0.bin", dir / "d/t1.bin"};
  BatchProducer bins(options, tok, expand_data_paths(options.data.paths), std::nullopt);
  Batch b;
  EXPECT_TRUE(bins.next(b));
  // Text without them: refused, saying what is missing.
  options.data.paths = {dir / "d"};
  EXPECT_NE(error_of([&] {
              BatchProducer(options, tok, files, std::nullopt);
            }).find("needs LoaderOptions::sum_over_ranks"),
            std::string::npos);
}

// Packed text over data-parallel ranks (threads here): the ranks split each window of a file's
// documents, sum their lengths, and tokenize the others' documents only where they reach into
// their own rows (the carried token included). On 2 ranks (2 micro-batches each) and 4 (one),
// every rank's own batches, every state after a batch and the state at the end are the whole
// stream's, bad records skipped alike; each rank tokenizes exactly its part of each window and
// the others' documents its own rows' windows touch, counted here from the stream itself;
// states saved by rank 1 of 2 resume on one process and on 4 ranks.
TEST(Loader, RanksTokenizeOnlyTheirShareOfPackedText) {
  const ScratchDir dir("text_share");
  const Tokenizer& tok = test::trained_tokenizer();
  // Each file's documents in file order: its stream length (tokens and EOS; 0 for an empty
  // document, -1 for a bad record).
  std::vector<std::vector<int64_t>> lengths(2);
  for (int f = 0; f < 2; ++f) {
    std::string jsonl;
    for (int i = 0; i < 300; ++i) {
      if (i % 97 == 13) {
        jsonl += "{not json\n";
        lengths[f].push_back(-1);
      } else if (i % 50 == 7) {
        jsonl += json{{"text", ""}}.dump() + "\n";
        lengths[f].push_back(0);
      } else {
        jsonl += json{{"text", prose(1000 * f + i)}}.dump() + "\n";
        lengths[f].push_back(
            static_cast<int64_t>(tok.encode_with_special_tokens(prose(1000 * f + i)).size()) + 1);
      }
    }
    write_text(dir / ("d/f" + std::to_string(f) + ".jsonl"), jsonl);
  }
  LoaderOptions o;
  o.data.paths = {dir / "d"};
  o.data.skip_bad_records = true;
  o.warn = [](const std::string&) {};
  o.seed = 7;
  o.batch_size = 4;
  o.seq_len = 32;
  o.epochs = 2;
  const std::vector<std::string> files = expand_data_paths(o.data.paths);
  const auto run = [&](const LoaderOptions& options, const RankShare& rank,
                       const std::optional<LoaderState>& from) {
    return walk(options, tok, files, rank, from);
  };
  const RankRun whole = run(o, {}, std::nullopt);
  ASSERT_GE(whole.batches.size(), 40u);
  EXPECT_EQ(whole.end.skipped, 3 * 2 * 2);  // 3 bad records a file, 2 files, 2 epochs
  const auto check = [&](const RankRun& share, size_t from, const LoaderOptions::Share& layout) {
    check_rank_walk(whole, share, from, layout, tok.pad_id(), [](LoaderState s) { return s; });
  };
  for (const int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const int64_t per_rank = n == 2 ? 2 : 1;
    const std::vector<RankRun> ranks = run_ranks<RankRun>(
        n, per_rank, [&](const RankShare& rank) { return run(o, rank, std::nullopt); });
    for (int r = 0; r < n; ++r) {
      check(ranks[static_cast<size_t>(r)], 0, {n * per_rank, r * per_rank, per_rank});
    }
  }
  // Resumed from rank 1 of 2's states (after its own batch and after the others').
  const std::vector<RankRun> pair =
      run_ranks<RankRun>(2, 1, [&](const RankShare& rank) { return run(o, rank, std::nullopt); });
  for (const size_t at : {2u, 5u, 22u}) {
    SCOPED_TRACE("resumed after batch " + std::to_string(at));
    const LoaderState& saved = pair[1].states[at];
    check(run(o, {}, saved), at + 1, {1, 0, 1});
    const std::vector<RankRun> on4 =
        run_ranks<RankRun>(4, 1, [&](const RankShare& rank) { return run(o, rank, saved); });
    for (int r = 0; r < 4; ++r) check(on4[static_cast<size_t>(r)], at + 1, {4, r, 1});
  }

  // The work, in file order (no shuffle: the test walks the stream itself). Document i of a
  // window is tokenized by rank i % N (windows start at a file's first document and hold a
  // multiple of N of them); another rank's document by every rank whose rows' windows
  // [k S, k S + S] it reaches, the last, dropped batch's too.
  o.shuffle = false;
  const int64_t S = o.seq_len, B = o.batch_size;
  struct Span {
    int64_t begin, end;  // in the stream
    int owner_slot;      // its place in its file
  };
  std::vector<Span> spans;  // the non-empty documents, in stream order
  int64_t whole_tokenized = 0;
  int64_t at = 0;
  for (int64_t e = 0; e < o.epochs; ++e) {
    for (const auto& file : lengths) {
      for (size_t i = 0; i < file.size(); ++i) {
        if (file[i] >= 0) ++whole_tokenized;  // an empty one is read and encoded too
        if (file[i] <= 0) continue;
        spans.push_back({at, at + file[i], static_cast<int>(i)});
        at += file[i];
      }
    }
  }
  const int64_t stream = at;
  const auto count_tokenized = [&](const RankShare& rank) {
    const LoaderOptions with = rank.applied_to(o);
    BatchProducer producer(with, tok, files, std::nullopt);
    for (Batch b; producer.next(b);) {
    }
    return producer.tokenized();  // no state read: a carry is read only for this rank's rows
  };
  EXPECT_EQ(count_tokenized({}), whole_tokenized);
  for (const int n : {2, 4}) {
    const std::vector<int64_t> counted = run_ranks<int64_t>(n, 1, count_tokenized);
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(n));
      int64_t expected = 0;
      for (int64_t e = 0; e < o.epochs; ++e) {
        for (const auto& file : lengths) {
          for (size_t i = 0; i < file.size(); ++i) {
            if (file[i] >= 0 && static_cast<int>(i % n) == r) ++expected;
          }
        }
      }
      for (const Span& d : spans) {
        if (d.owner_slot % n == r) continue;
        bool reaches = false;
        for (int64_t k = d.begin / S - 1; k <= d.end / S && !reaches; ++k) {
          const bool own = k >= 0 && (k / B) % n == r && k * S < stream;
          reaches = own && d.begin <= k * S + S && d.end > k * S;
        }
        expected += reaches ? 1 : 0;
      }
      const int64_t tokenized = counted[static_cast<size_t>(r)];
      EXPECT_EQ(tokenized, expected);
      std::printf("rank %d of %d tokenizes %lld of %lld documents (%.3f; (2N - 1) / N^2 = %.3f)\n",
                  r, n, static_cast<long long>(tokenized), static_cast<long long>(whole_tokenized),
                  static_cast<double>(tokenized) / static_cast<double>(whole_tokenized),
                  (2.0 * n - 1) / (n * n));
    }
  }

  // Without skip_bad_records every rank stops at the first bad record (f0's line 14, document 13:
  // rank 1's of 2) after the same batches: the rank that read it with its line, the other naming
  // the document and that rank.
  o.data.skip_bad_records = false;
  const std::vector<RankStop> stops = run_ranks<RankStop>(
      2, 1, [&](const RankShare& rank) { return walk_to_error(o, tok, files, rank); });
  EXPECT_GT(stops[0].batches, 0u);
  EXPECT_EQ(stops[0].batches, stops[1].batches);
  EXPECT_EQ(stops[1].error.rfind(dir / "d/f0.jsonl:14: the record is not valid JSON", 0), 0u)
      << stops[1].error;
  EXPECT_EQ(stops[0].error, dir / "d/f0.jsonl" +
                                ": document 13 (from 0, in file order) is a bad record, read by "
                                "data-parallel rank 1");
}

// A conversation that reads but does not encode (reasoning_content under the Qwen2.5 template),
// in rank 1's share of a packed window: every rank stops at it with the same job-wide error (rank
// 0 prints it for the job), the line one process gives, after the same batches -- rank 0 does not
// wait in the lengths' sum for a rank that already stopped.
TEST(LoaderChat, AnUnencodableConversationStopsEveryRankAlike) {
  const ScratchDir dir("chat_unencodable");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  for (int i = 0; i < 40; ++i) {
    json line = json::parse(chat_line("question " + std::to_string(i), prose(i)));
    if (i == 25) line["messages"][1]["reasoning_content"] = "thinking";
    jsonl += line.dump() + "\n";
  }
  write_text(dir / "d/chat.jsonl", jsonl);
  LoaderOptions o = chat_options(dir / "d", 2, 256);
  o.chat_template = ChatTemplate(ChatTemplateKind::qwen2_5);
  o.truncate_long = true;
  o.pack_conversations = true;
  o.shuffle = false;  // conversation 25 is rank 1's of 2 (each window's i-th is rank i % 2's)
  const std::vector<std::string> files = expand_data_paths(o.data.paths);
  const std::string expected = dir / "d/chat.jsonl" +
                               ":26: chat template: message 1 has reasoning_content, which the "
                               "Qwen2.5 Instruct template does not render (only Qwen3's does)";
  const RankStop alone = walk_to_error(o, tok, files, {});
  EXPECT_EQ(alone.error, expected);
  EXPECT_GT(alone.batches, 0u);
  struct JobWideStop {
    RankStop stop;
    bool job_wide = false;
  };
  const std::vector<JobWideStop> stops = run_ranks<JobWideStop>(2, 1, [&](const RankShare& rank) {
    JobWideStop s;
    const LoaderOptions with = rank.applied_to(o);  // the producer keeps a reference
    BatchProducer producer(with, tok, files, std::nullopt);
    try {
      for (Batch b; producer.next(b);) ++s.stop.batches;
    } catch (const JobWideError& e) {
      s.job_wide = true;
      s.stop.error = e.what();
    } catch (const Error& e) {
      s.stop.error = e.what();
    }
    return s;
  });
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(stops[r].job_wide);
    EXPECT_EQ(stops[r].stop.error, expected);
    EXPECT_EQ(stops[r].stop.batches, alone.batches);
  }
}

// Packed conversations over data-parallel ranks (threads here), as packed text above: the ranks
// split the encoding of each window of a file's conversations and sum their lengths, and a rank
// encodes another's conversation only where it lands in its own rows. Each rank's own batches,
// states and resumes equal the one-process walk's; the conversations each rank encodes are
// counted exactly.
TEST(LoaderChat, RanksEncodeOnlyTheirShareOfPackedConversations) {
  const ScratchDir dir("chat_share");
  const Tokenizer& tok = test::trained_tokenizer();
  const ChatTemplate qwen3(ChatTemplateKind::qwen3);
  // Each file's conversations in file order: their encoded length (-1 for a bad record).
  std::vector<std::vector<int64_t>> lengths(2);
  for (int f = 0; f < 2; ++f) {
    std::string jsonl;
    for (int i = 0; i < 150; ++i) {
      if (i % 61 == 11) {
        jsonl += "{not json\n";
        lengths[f].push_back(-1);
        continue;
      }
      const int k = 1000 * f + i;
      // Every 17th too long for a row: cut (truncate_long).
      const std::string reply = i % 17 == 3 ? prose(k) + prose(k + 1) + prose(k + 2) : prose(k);
      jsonl += chat_line("question " + std::to_string(k), reply);
      std::vector<int32_t> ids, labels;
      encode_chat(tok, qwen3,
                  {{"user", "question " + std::to_string(k), ""}, {"assistant", reply, ""}}, ids,
                  labels);
      lengths[f].push_back(static_cast<int64_t>(ids.size()));
    }
    write_text(dir / ("d/f" + std::to_string(f) + ".jsonl"), jsonl);
  }
  constexpr int64_t S = 64, B = 2;
  LoaderOptions o = chat_options(dir / "d", B, S);
  o.pack_conversations = true;
  o.truncate_long = true;
  o.data.skip_bad_records = true;
  o.warn = [](const std::string&) {};
  o.seed = 5;
  o.epochs = 2;
  const std::vector<std::string> files = expand_data_paths(o.data.paths);
  const auto run = [&](const LoaderOptions& options, const RankShare& rank,
                       const std::optional<LoaderState>& from) {
    return walk(options, tok, files, rank, from);
  };
  // A state but its count of cut conversations: each rank counts those of its own rows.
  const auto but_truncated = [](LoaderState s) {
    s.truncated = 0;
    return s;
  };
  const RankRun whole = run(o, {}, std::nullopt);
  ASSERT_GE(whole.batches.size(), 40u);
  EXPECT_EQ(whole.end.skipped, 3 * 2 * 2);  // 3 bad records a file, 2 files, 2 epochs
  EXPECT_GT(whole.end.truncated, 0);
  const auto check = [&](const RankRun& share, size_t from, const LoaderOptions::Share& layout) {
    check_rank_walk(whole, share, from, layout, tok.pad_id(), but_truncated);
  };
  for (const int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const std::vector<RankRun> ranks =
        run_ranks<RankRun>(n, 1, [&](const RankShare& rank) { return run(o, rank, std::nullopt); });
    int64_t truncated = 0;
    for (int r = 0; r < n; ++r) {
      check(ranks[static_cast<size_t>(r)], 0, {n, r, 1});
      truncated += ranks[static_cast<size_t>(r)].end.truncated;
    }
    EXPECT_EQ(truncated, whole.end.truncated);  // each cut counted by the rank whose row it is
  }
  // Resumed from rank 1 of 2's states (after its own batch and after the other's): on one
  // process, and on 4 ranks.
  const std::vector<RankRun> pair =
      run_ranks<RankRun>(2, 1, [&](const RankShare& rank) { return run(o, rank, std::nullopt); });
  for (const size_t at : {2u, 5u, 22u}) {
    SCOPED_TRACE("resumed after batch " + std::to_string(at));
    const LoaderState& saved = pair[1].states[at];
    check(run(o, {}, saved), at + 1, {1, 0, 1});
    const std::vector<RankRun> on4 =
        run_ranks<RankRun>(4, 1, [&](const RankShare& rank) { return run(o, rank, saved); });
    for (int r = 0; r < 4; ++r) check(on4[static_cast<size_t>(r)], at + 1, {4, r, 1});
  }

  // The work, in file order (no shuffle: the test packs the rows itself). Conversation i of a
  // file is encoded by rank i % N (windows start at a file's first conversation and hold a
  // multiple of N of them); another rank's by every rank whose row it lands in: the rows take
  // conversations while their inputs (their tokens but the last, cut to S) fit.
  o.shuffle = false;
  struct Placed {
    int64_t row;
    int owner_slot;  // its place in its file
  };
  std::vector<Placed> placed;
  int64_t whole_encoded = 0, row = 0, filled = 0;
  for (int64_t e = 0; e < o.epochs; ++e) {
    for (const auto& file : lengths) {
      for (size_t i = 0; i < file.size(); ++i) {
        if (file[i] < 0) continue;
        ++whole_encoded;
        const int64_t inputs = std::min(file[i], S + 1) - 1;
        if (filled >= S || inputs > S - filled) {
          ++row;
          filled = 0;
        }
        placed.push_back({row, static_cast<int>(i)});
        filled += inputs;
      }
    }
  }
  EXPECT_EQ(run(o, {}, std::nullopt).tokenized, whole_encoded);
  for (const int n : {2, 4}) {
    const std::vector<RankRun> ranks =
        run_ranks<RankRun>(n, 1, [&](const RankShare& rank) { return run(o, rank, std::nullopt); });
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(n));
      int64_t expected = 0;
      for (const Placed& c : placed) {
        const bool own_row = (c.row / B) % n == r;
        if (c.owner_slot % n == r || own_row) ++expected;
      }
      const int64_t encoded = ranks[static_cast<size_t>(r)].tokenized;
      EXPECT_EQ(encoded, expected);
      std::printf("rank %d of %d encodes %lld of %lld conversations (%.3f)\n", r, n,
                  static_cast<long long>(encoded), static_cast<long long>(whole_encoded),
                  static_cast<double>(encoded) / static_cast<double>(whole_encoded));
    }
  }

  // Without skip_bad_records every rank stops at the first bad record (f0's line 12, document 11:
  // rank 1's of 2) after the same batches: the rank that read it with its line, the other naming
  // the document and that rank.
  o.data.skip_bad_records = false;
  const auto stop_of = [&](const RankShare& rank) { return walk_to_error(o, tok, files, rank); };
  const std::vector<RankStop> stops = run_ranks<RankStop>(2, 1, stop_of);
  EXPECT_GT(stops[0].batches, 0u);
  EXPECT_EQ(stops[0].batches, stops[1].batches);
  EXPECT_EQ(stops[1].error.rfind(dir / "d/f0.jsonl:12: the record is not valid JSON", 0), 0u)
      << stops[1].error;
  EXPECT_EQ(stops[0].error, dir / "d/f0.jsonl" +
                                ": document 11 (from 0, in file order) is a bad record, read by "
                                "data-parallel rank 1");
  // Without truncate_long every rank stops at the first conversation too long for a row (f0's
  // line 2, document 1: rank 1's of 2), the rank that encoded it naming its line, the other the
  // document.
  o.data.skip_bad_records = true;
  o.truncate_long = false;
  const std::vector<RankStop> long_stops = run_ranks<RankStop>(2, 1, stop_of);
  EXPECT_EQ(long_stops[0].batches, long_stops[1].batches);
  EXPECT_EQ(long_stops[1].error.rfind(dir / "d/f0.jsonl:2: the conversation has ", 0), 0u)
      << long_stops[1].error;
  EXPECT_EQ(long_stops[0].error.rfind(
                dir / "d/f0.jsonl: document 1 (from 0, in file order): the conversation has ", 0),
            0u)
      << long_stops[0].error;
}

// Packed chat rows (LoaderOptions::pack_conversations): the conversations of the unpacked rows,
// in the same order and cut the same way, one after another while each fits whole (one that does
// not starts the next row), each with its start as its tokens' segment start, then padding (a
// segment of its own, nothing scored); fewer rows for the same data; a resume from any batch's
// state continues with the same batches; and a state saved unpacked is refused.
TEST(LoaderChat, PackedRowsHoldWholeConversationsInOrder) {
  const ScratchDir dir("chat_packed");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  for (int i = 0; i < 11; ++i) {
    jsonl += chat_line("question " + std::to_string(i), prose(i));
  }
  write_text(dir / "chat.jsonl", jsonl);
  constexpr int64_t S = 256;
  LoaderOptions o = chat_options(dir / "chat.jsonl", 2, S);
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> alone;  // ids, labels
  {
    LoaderOptions one = o;
    one.batch_size = 1;
    DataLoader loader(one, tok);
    for (const Batch& b : drain(loader)) {
      EXPECT_TRUE(b.segment_start.empty());
      int64_t n = S;
      while (n > 0 && b.labels[n - 1] == kIgnoreLabel && b.input_ids[n - 1] == tok.pad_id()) --n;
      alone.emplace_back(std::vector<int32_t>(b.input_ids.begin(), b.input_ids.begin() + n),
                         std::vector<int32_t>(b.labels.begin(), b.labels.begin() + n));
    }
  }
  ASSERT_EQ(alone.size(), 11u);
  o.pack_conversations = true;
  DataLoader loader(o, tok);
  const std::vector<Batch> batches = drain(loader);
  size_t next = 0, rows = 0;
  for (const Batch& b : batches) {
    ASSERT_EQ(b.segment_start.size(), static_cast<size_t>(2 * S));
    for (int64_t row = 0; row < 2; ++row, ++rows) {
      const int64_t r0 = row * S;
      int64_t at = 0;
      while (next < alone.size() && static_cast<int64_t>(alone[next].first.size()) <= S - at) {
        const auto& [ids, labels] = alone[next++];
        const auto len = static_cast<int64_t>(ids.size());
        EXPECT_TRUE(std::equal(ids.begin(), ids.end(), b.input_ids.begin() + r0 + at));
        EXPECT_TRUE(std::equal(labels.begin(), labels.end(), b.labels.begin() + r0 + at));
        for (int64_t i = 0; i < len; ++i) ASSERT_EQ(b.segment_start[r0 + at + i], at);
        at += len;
      }
      for (int64_t i = at; i < S; ++i) {
        ASSERT_EQ(b.input_ids[r0 + i], tok.pad_id());
        ASSERT_EQ(b.labels[r0 + i], kIgnoreLabel);
        ASSERT_EQ(b.segment_start[r0 + i], at);
      }
    }
  }
  EXPECT_EQ(next, alone.size());
  EXPECT_LT(rows, alone.size()) << "packing saved no row";
  // Resumed after the first batch: the same batches follow.
  DataLoader first(o, tok);
  ASSERT_TRUE(first.next_batch().has_value());
  DataLoader resumed(o, tok, first.state());
  const std::vector<Batch> rest = drain(resumed);
  ASSERT_EQ(rest.size(), batches.size() - 1);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].input_ids, batches[i + 1].input_ids);
    EXPECT_EQ(rest[i].labels, batches[i + 1].labels);
    EXPECT_EQ(rest[i].segment_start, batches[i + 1].segment_start);
  }
  LoaderOptions unpacked = o;
  unpacked.pack_conversations = false;
  EXPECT_NE(error_of([&] {
              DataLoader again(unpacked, tok, first.state());
            }).find("saved with mode chat_packed, but this run has chat"),
            std::string::npos);
}

// A finite pass over chat data scores every conversation once: the last batch is kept, the rows
// the data did not fill left empty (padding, nothing scored); pre-training drops it.
TEST(LoaderChat, TheLastPartialBatchIsKeptWithEmptyRows) {
  const ScratchDir dir("chat_last");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  for (int i = 0; i < 5; ++i) {
    jsonl += chat_line("question " + std::to_string(i), "answer " + std::to_string(i));
  }
  write_text(dir / "chat.jsonl", jsonl);
  LoaderOptions o = chat_options(dir / "chat.jsonl", 2, 64);
  DataLoader loader(o, tok);
  const std::vector<Batch> batches = drain(loader);
  ASSERT_EQ(batches.size(), 3u);
  int scored_rows = 0;
  for (const Batch& b : batches) {
    ASSERT_EQ(b.input_ids.size(), 128u);
    for (int row = 0; row < 2; ++row) {
      const auto labels = b.labels.begin() + row * 64;
      scored_rows += std::any_of(labels, labels + 64, [](int32_t l) { return l != kIgnoreLabel; });
    }
  }
  EXPECT_EQ(scored_rows, 5);
  const Batch& last = batches.back();
  for (size_t s = 64; s < 128; ++s) {
    EXPECT_EQ(last.input_ids[s], tok.pad_id());
    EXPECT_EQ(last.labels[s], kIgnoreLabel);
  }
  EXPECT_EQ(loader.state().batches, 3);
}

// ---- bad input ----

TEST(LoaderBadInput, BadLineStopsTheLoaderWithFileAndLine) {
  const ScratchDir dir("bad_line");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  for (int i = 0; i < 50; ++i) jsonl += json{{"text", prose(i)}}.dump() + "\n";
  jsonl += "{\"text\": \"cut off\n";
  for (int i = 0; i < 5; ++i) jsonl += json{{"content", prose(i)}}.dump() + "\n";
  write_text(dir / "a.jsonl", jsonl);
  LoaderOptions o;
  o.data.paths = {dir / "a.jsonl"};
  o.shuffle = false;
  o.seq_len = 8;
  DataLoader loader(o, tok);
  std::string error;
  size_t n = 0;
  try {
    while (loader.next_batch()) ++n;
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_GT(n, 10u) << "the batches before the bad line arrive first";
  EXPECT_EQ(error.rfind(dir / "a.jsonl:51: the record is not valid JSON", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
  EXPECT_THROW(loader.next_batch(), Error);  // and again: the loader stays stopped

  // With skipping, the bad line and the five without "text" are counted and reported.
  o.data.skip_bad_records = true;
  o.epochs = 1;
  std::vector<std::string> warnings;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  DataLoader skipping(o, tok);
  drain(skipping);
  EXPECT_EQ(skipping.state().skipped, 6);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].rfind(dir / "a.jsonl: skipped 6 bad record(s); the first: " +
                                  dir / "a.jsonl:51: the record is not valid JSON",
                              0),
            0u)
      << warnings[0];
}

TEST(LoaderBadInput, TokenFilesMustMatchTheVocabulary) {
  const ScratchDir dir("bad_vocab");
  const Tokenizer& tok = test::trained_tokenizer();
  {
    TokenFileWriter w(dir / "t.bin", 4096);
    w.add_doc({1, 2, 3});
    w.commit();
  }
  LoaderOptions o;
  o.data.paths = {dir / "t.bin"};
  o.seq_len = 4;
  DataLoader loader(o, tok);
  EXPECT_EQ(error_of([&] { loader.next_batch(); }),
            dir / "t.bin: written for a vocabulary of 4096 ids, but the tokenizer has 2048");
}

TEST(LoaderBadInput, LongConversationsStopOrAreCut) {
  const ScratchDir dir("bad_long");
  const Tokenizer& tok = test::trained_tokenizer();
  write_text(dir / "c.jsonl", chat_line(prose(1), prose(2)));
  LoaderOptions o = chat_options(dir / "c.jsonl", 1, 16);
  {
    DataLoader loader(o, tok);
    const std::string e = error_of([&] { loader.next_batch(); });
    EXPECT_NE(e.find(dir / "c.jsonl:1: the conversation has "), std::string::npos) << e;
    EXPECT_NE(e.find("more than seq_len + 1 = 17"), std::string::npos) << e;
  }
  o.truncate_long = true;
  DataLoader loader(o, tok);
  EXPECT_EQ(drain(loader).size(), 1u);
  EXPECT_EQ(loader.state().truncated, 1);
}

TEST(LoaderBadInput, StateFromAnotherRunIsRefused) {
  const ScratchDir dir("bad_state");
  const Tokenizer& tok = test::trained_tokenizer();
  LoaderOptions o = mixed_dataset(dir);
  LoaderState s;
  {
    DataLoader loader(o, tok);
    loader.next_batch();
    s = loader.state();
  }
  o.seed = 99;
  EXPECT_EQ(error_of([&] { DataLoader(o, tok, s); }),
            "loader state: saved with seed 1234, but this run has 99");
  o.seed = 1234;
  o.seq_len = 32;
  EXPECT_EQ(error_of([&] { DataLoader(o, tok, s); }),
            "loader state: saved with seq_len 24, but this run has 32");
  o.seq_len = 24;
  write_text(dir / "d/f.txt", "one more file");
  EXPECT_NE(error_of([&] { DataLoader(o, tok, s); }).find("saved with dataset files"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { LoaderState::from_json("{\"format\": \"x\"}"); }),
            "loader state: not a titan loader state");
  EXPECT_NE(error_of([&] {
              LoaderState::from_json(
                  "{\"format\": \"titan-loader-state\", "
                  "\"version\": 1}");
            }).find("loader state: missing or malformed field"),
            std::string::npos);
}

}  // namespace
}  // namespace titan
