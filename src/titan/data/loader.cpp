#include "titan/data/loader.h"

#include "titan/data/dataset_read.h"
#include "titan/data/loader_producer.h"

namespace titan {

DataLoader::DataLoader(LoaderOptions options, const Tokenizer& tok,
                       std::optional<LoaderState> resume)
    : options_(std::move(options)) {
  TITAN_CHECK(options_.prefetch >= 1, "loader: prefetch must be >= 1, got ", options_.prefetch);
  // The producer's sums run where the caller's collectives run: on the thread of next_batch.
  sum_over_ranks_ = std::move(options_.sum_over_ranks);
  if (sum_over_ranks_) {
    options_.sum_over_ranks = [this](double* values, int64_t count) { relay_sum(values, count); };
  }
  producer_ = std::make_unique<BatchProducer>(options_, tok, expand_data_paths(options_.data.paths),
                                              resume);
  consumed_ = producer_->position();
  thread_ = std::thread([this] { produce(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_.notify_all();
  thread_.join();
}

// The background thread: fills the queue up to `prefetch` batches ahead of the consumer. Each
// batch travels with the state after it, so state() always matches what was handed out.
void DataLoader::produce() {
  for (;;) {
    Item item;
    try {
      Batch batch;
      if (producer_->next(batch)) item.batch = std::move(batch);
      item.position = producer_->position();
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool last = !item.batch;
    std::unique_lock<std::mutex> lock(mutex_);
    space_.wait(lock,
                [&] { return stop_ || queue_.size() < static_cast<size_t>(options_.prefetch); });
    if (stop_) return;  // an error of a sum the stop cut short included
    queue_.push_back(std::move(item));
    ready_.notify_one();
    if (last) return;  // the end, or an error: nothing follows
  }
}

void DataLoader::relay_sum(double* values, int64_t count) {
  std::unique_lock<std::mutex> lock(mutex_);
  sum_request_ = SumRequest{values, count};
  ready_.notify_one();
  space_.wait(lock, [&] { return stop_ || !sum_request_; });
  TITAN_CHECK(!stop_, "loader: stopped while waiting for the data-parallel ranks' sums");
}

std::optional<Batch> DataLoader::next_batch() {
  std::unique_lock<std::mutex> lock(mutex_);
  // A batch ready goes first: a sum asked for meanwhile is for a later batch, run in the call
  // that hands that one out -- on every rank the same call, since every rank's producer asks
  // while making the same batch of the same stream.
  for (;;) {
    ready_.wait(lock, [&] { return !queue_.empty() || sum_request_; });
    if (!queue_.empty()) break;
    const SumRequest request = *sum_request_;
    lock.unlock();
    sum_over_ranks_(request.values, request.count);
    lock.lock();
    sum_request_.reset();
    space_.notify_all();
  }
  // The end (or an error) stays at the front: asking again gives the same answer.
  if (queue_.front().error) std::rethrow_exception(queue_.front().error);
  if (!queue_.front().batch) {
    consumed_ = queue_.front().position;  // the end: the totals include the dropped tail
    return std::nullopt;
  }
  Item item = std::move(queue_.front());
  queue_.pop_front();
  space_.notify_one();
  consumed_ = std::move(item.position);
  return std::move(item.batch);
}

LoaderState DataLoader::state() const {
  LoaderPosition position;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    position = consumed_;
  }
  return position.read();  // outside the lock: it may read a carried token from its file
}

}  // namespace titan
