#include "titan/train/evaluate.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/core/progress.h"

namespace titan {

EvalResult evaluate(CausalLM& model, DataLoader& loader, int64_t max_batches) {
  EvalResult result;
  double loss_sum = 0.0;
  Progress progress("evaluating", std::max<int64_t>(max_batches, 0), ProgressUnit::batches);
  while (max_batches < 0 || result.batches < max_batches) {
    std::optional<Batch> b = loader.next_batch();
    if (!b) break;
    ForwardOptions options;  // packed rows' segments, as the loader made them
    options.segment_start = b->segment_start.empty() ? nullptr : b->segment_start.data();
    const CrossEntropyResult r =
        model.forward(b->input_ids.data(), b->labels.data(), b->batch_size, b->seq_len, options);
    loss_sum += r.loss_sum;
    result.tokens += r.n_scored;
    ++result.batches;
    progress.advance(1);
  }
  progress.finish();
  TITAN_CHECK(result.tokens > 0, "evaluation: the data gave no full batch with scored tokens");
  result.loss = loss_sum / static_cast<double>(result.tokens);
  return result;
}

}  // namespace titan
