// TensorBoard's event files, written here without TensorFlow or a protobuf library: a TFRecord
// stream (each record: its length, the masked CRC-32C of the length, the bytes, their masked
// CRC-32C) of tensorflow.Event messages encoded by hand -- the first a file_version
// "brain.Event:2", then one per logged step whose Summary holds every scalar as a simple_value
// (float32, as PyTorch's SummaryWriter.add_scalar writes them). TensorBoard reads a file as it
// grows, so each event is flushed as it is written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace titan {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, named as TensorFlow's writers
  // name theirs, events.out.tfevents.<10-digit unix time>.<hostname>.<pid>; titan::Error naming
  // the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` holding each (tag, value), flushed to the file; titan::Error naming the
  // file when the write fails (a full disk).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace titan
