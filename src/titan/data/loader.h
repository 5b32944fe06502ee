// The training data loader: documents from a dataset (dataset.h) tokenized on a background thread
// and packed into fixed-shape batches, in an order fixed by the seed, sharded over data-parallel
// ranks, and resumable exactly from a saved LoaderState.
//
// A row is torchtitan's: seq_len = S inputs and S targets, cut from a window of S + 1 tokens w as
// inputs w[:-1] and labels w[1:] -- labels[s] is the token position s predicts (no shift left to
// do; CausalLM::forward scores position s against labels[s]).
//
// Pre-training packing: every document's ids (text encoded with the post-processor's special
// tokens, as HF's tokenizer(text): Llama 3 starts each with <|begin_of_text|>; "ids" records and
// token files as they are) are followed by the tokenizer's EOS and joined into
// one stream per rank. Row k's window is stream[k * S, k * S + S + 1): consecutive windows share
// one token (the last label of a row is the first input of the next), so every next-token target
// of the stream is scored exactly once. Rows run on across documents, files and epochs. The
// stream of rows does not depend on batch_size.
//
// Chat fine-tuning (DataMode::chat): one conversation of at most S + 1 tokens per window, inputs
// and labels cut from it the same way and padded to S (the pad id, the EOS when the tokenizer has
// none; labels -100), labels only on the assistant replies (dataset_chat.h), rendered with
// LoaderOptions::chat_template. With LoaderOptions::pack_conversations (training.dataset_packing,
// TRL's packing), whole conversations follow one another in a row instead, as many as fit (one
// that does not starts the next row; the rest of a row is padding), and Batch::segment_start says
// where each one starts: the model keeps attention inside each and restarts positions at each
// (CausalLM ForwardOptions::segment_start), so a packed row computes what its conversations
// compute in rows of their own, with less padding.
//
// Order: each epoch visits the files in an order shuffled by (seed, epoch) and, within a file, the
// documents in an order shuffled by (seed, epoch, file). Rank r of W takes the documents at
// positions r, r + W, r + 2W, ... of each file's order, so ranks see disjoint documents whose union
// is the whole dataset. Ranks hold different amounts of data, so with a finite number of epochs
// they may run out at different steps.
//
// Shapes are fixed. When the data ends (a finite number of epochs), a batch that cannot be filled
// is dropped in pre-training; in chat mode it is kept, its missing rows empty (the pad id, labels
// -100), so a finite pass scores every conversation exactly once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "titan/data/chat_template.h"
#include "titan/data/dataset.h"
#include "titan/data/loader_carry.h"
#include "titan/data/loader_state.h"
#include "titan/data/tokenizer.h"

namespace titan {

struct LoaderOptions {
  DatasetOptions data;
  DataMode mode = DataMode::pretrain;
  // Chat mode: the template conversations are rendered with, the one of the tokenizer's folder
  // (ChatTemplate::load); required there.
  std::optional<ChatTemplate> chat_template;
  int64_t batch_size = 1;  // B: rows per batch (per rank)
  int64_t seq_len = 2048;  // S: inputs (and targets) per row
  uint64_t seed = 0;
  bool shuffle = true;  // false: files in sorted order, documents in file order
  int rank = 0, world_size = 1;
  int64_t epochs = 0;  // passes over the data; 0 repeats forever
  // Chat: cut conversations longer than seq_len + 1 tokens (and count them) instead of stopping
  // with an error naming the record.
  bool truncate_long = false;
  // Chat: several conversations per row (see above); resumes only with the same setting.
  bool pack_conversations = false;
  // What that error suggests, in the caller's terms (a config key, a flag).
  std::string long_conversation_hint = "raise seq_len, or let the loader truncate";
  // Data parallelism over the one stream of batches every rank walks (the trainer's): each step
  // takes `step_batches` consecutive batches and this rank trains on the `count` of them from
  // `first` on (counted from LoaderState::batches, so that the stream, and any saved state, is
  // the same for every layout of the same global batch: a state resumes on another data-parallel
  // degree). The other batches come back with Batch::own false and their rows left empty
  // (padding, labels -100). Where a row's bounds do not depend on its tokens -- chat data, one
  // conversation per row -- their records are read (a bad one is skipped as before) but not
  // tokenized (a too-long conversation is refused by the rank whose row it is). Packed pre-
  // training rows end where the token counts say: a token file's documents are measured by its
  // document table and their tokens are not read (the carried token too stays unread until this
  // rank's next row or a saved state needs it: loader_carry.h), so a rank reads only its own
  // rows' tokens. Text and JSON documents must be tokenized to be measured: the N = step_batches
  // / count data-parallel ranks split each window of a file's documents (rank r = first / count
  // tokenizes those at r, r + N, ... of it) and sum their lengths over the ranks
  // (sum_over_ranks below, one small collective per window, lengths only), so every rank knows
  // where every row starts; then a rank tokenizes the others' documents only where they reach into
  // its own rows or the token it carries into them (a carried token of another rank's text
  // document is tokenized when read: loader_carry.h). Tokenizer work per rank: its 1/N of the
  // documents, plus the others' in its own 1/N of the rows, about (2N - 1) / N^2 of the whole.
  // Packed conversations (pack_conversations) alike: rendered and encoded (ids and labels) by the
  // rank of their window, and by another only where they land in its own rows.
  // LoaderState::truncated counts this rank's rows only. Default: every batch is own.
  struct Share {
    int64_t step_batches = 1, first = 0, count = 1;
  };
  Share share;
  // values (count) = their sum over the data-parallel ranks of the share, in place (the
  // trainer's data-parallel group's all_reduce_sum); required for packed text or conversations
  // where the share leaves batches to other ranks. DataLoader calls it on the thread that calls
  // next_batch, inside the call that hands out the batch needing it, which is the same call on
  // every rank (the stream is); BatchProducer on the thread that calls next().
  std::function<void(double* values, int64_t count)> sum_over_ranks;
  int prefetch = 4;  // batches the background thread may have ready
  // Receives one line per file with skipped records (default: stderr). Totals of skipped records
  // and cut conversations are in LoaderState.
  std::function<void(const std::string&)> warn;
};

struct Batch {
  int64_t batch_size = 0, seq_len = 0;
  std::vector<int32_t> input_ids;  // (B, S)
  std::vector<int32_t> labels;     // (B, S): the target of each input, -100 where not scored
  // (B, S) packed chat rows: the position in its row where each token's conversation starts (the
  // padding after the last one is a segment of its own); empty when rows are not packed.
  std::vector<int32_t> segment_start;
  bool own = true;  // one of this rank's batches (LoaderOptions::share)
};

class BatchProducer;

class DataLoader {
 public:
  // Lists and checks the files, restores `resume` if given (it must come from a loader with the
  // same mode, seed, shuffle, seq_len, rank, world size and files), and starts the background
  // thread. `tok` must outlive the loader. Configuration errors are thrown here.
  DataLoader(LoaderOptions options, const Tokenizer& tok,
             std::optional<LoaderState> resume = std::nullopt);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch, or nullopt when the epochs are done. A data error found by the background
  // thread is thrown here, after the batches that preceded it (and again on every later call).
  std::optional<Batch> next_batch();
  // The position after the last batch next_batch returned: a loader restored from it returns the
  // batches this one would return next. After the end, the end (its skipped and truncated totals
  // cover the whole data).
  LoaderState state() const;

 private:
  struct Item {
    std::optional<Batch> batch;
    LoaderPosition position;  // after the batch; its carry read only when state() asks
    std::exception_ptr error;
  };
  void produce();
  // The producer's sum_over_ranks: hands the values to the thread in next_batch and waits.
  void relay_sum(double* values, int64_t count);

  LoaderOptions options_;                                 // sum_over_ranks: relay_sum
  std::function<void(double*, int64_t)> sum_over_ranks_;  // the caller's
  std::unique_ptr<BatchProducer> producer_;
  LoaderPosition consumed_;  // the position after the last batch handed out
  mutable std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::deque<Item> queue_;
  struct SumRequest {
    double* values;
    int64_t count;
  };
  std::optional<SumRequest> sum_request_;  // the producer waits for next_batch to run it
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace titan
