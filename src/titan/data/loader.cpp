#include "titan/data/loader.h"

#include "titan/data/dataset_read.h"
#include "titan/data/loader_producer.h"

namespace titan {

DataLoader::DataLoader(LoaderOptions options, const Tokenizer& tok,
                       std::optional<LoaderState> resume)
    : options_(std::move(options)) {
  TITAN_CHECK(options_.prefetch >= 1, "loader: prefetch must be >= 1, got ", options_.prefetch);
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
    if (stop_) return;
    queue_.push_back(std::move(item));
    ready_.notify_one();
    if (last) return;  // the end, or an error: nothing follows
  }
}

std::optional<Batch> DataLoader::next_batch() {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return !queue_.empty(); });
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
