// Where a DataLoader is in its data, small enough to store in every checkpoint. Restoring it gives
// exactly the batches the uninterrupted run would have produced. No RNG state is kept: every
// shuffle is derived afresh from (seed, epoch, file), so the position alone fixes the future.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

struct LoaderState {
  // Position: the next row's window starts with `carry`, followed by the tokens of this rank's
  // document `doc` of file `file` (in epoch `epoch`'s file order) from token `doc_offset` on (its
  // EOS included), then the documents after it.
  int64_t epoch = 0;
  int64_t file = 0;            // position in the epoch's file order
  int64_t doc = 0;             // position among this rank's documents of that file
  int64_t doc_offset = 0;      // tokens of that document already packed into rows
  std::vector<int32_t> carry;  // pre-training: packed tokens not yet fully scored (<= seq_len)
  int64_t batches = 0;         // batches produced so far
  int64_t skipped = 0;         // bad records skipped so far
  int64_t truncated = 0;       // chat conversations cut to seq_len so far (this rank's rows)

  // What the position is only meaningful for; checked on restore.
  std::string mode;  // "pretrain" or "chat"
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t seq_len = 0;
  int rank = 0, world_size = 1;
  std::string files_fingerprint;  // names and sizes of the dataset's files

  std::string to_json() const;
  // Parses what to_json wrote; a malformed blob is a titan::Error.
  static LoaderState from_json(const std::string& text);
  bool operator==(const LoaderState&) const = default;
};

}  // namespace titan
