// Reading safetensors checkpoints: one file, or a sharded folder with
// model.safetensors.index.json. Files are memory-mapped; entries point into the mapping, so a
// tensor whose dtype already matches is used in place and the rest convert straight from it.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "titan/io/mapped_file.h"
#include "titan/io/safetensors_header.h"

namespace titan {

class SafetensorsFile {
 public:
  // Maps and validates `path` (parse_safetensors_header); throws titan::Error naming the file.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  // In data order; `data` points into the mapping, valid while this object lives.
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  const SafetensorsEntry* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  size_t file_size() const { return file_.size(); }
  // Readahead hint for the whole data buffer before a full load.
  void prefetch() const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries
};

// All tensors of a checkpoint, whether in one file or in shards listed by an index.
class SafetensorsCheckpoint {
 public:
  // `path` is a model folder (its model.safetensors.index.json, else its model.safetensors), an
  // index file, or one .safetensors file. An index naming a missing shard, a weight_map entry
  // absent from its shard, a shard tensor the index does not list, or a name in two shards is a
  // titan::Error naming the index, the shard and the tensor. In a folder titan wrote (an HF
  // export: its titan.json records checksums, io/atomic_dir.h) the index and every file opened
  // must hold the bytes the export wrote, else a titan::Error naming the file (about 0.5 s per
  // GiB, once per process and file).
  static SafetensorsCheckpoint open(const std::string& path);
  // Whether the folder `dir` holds what open() reads from a folder: model.safetensors.index.json
  // or model.safetensors.
  static bool in_folder(const std::string& dir);

  // The index or the single file that was opened.
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // Like find(), but a missing tensor is a titan::Error naming the checkpoint and the tensor.
  const SafetensorsEntry& at(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return by_name_.size(); }
  size_t data_bytes() const;  // sum of every tensor's bytes (the index's total_size)

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const SafetensorsEntry*, std::less<>> by_name_;
};

// Converts a float tensor (F32, BF16 or F16) into `dst`, which holds exactly `numel` floats.
// A different element count or a non-float dtype is a titan::Error naming file and tensor.
void read_f32(const SafetensorsEntry& entry, float* dst, size_t numel);
// Elements [first, first + count) of the tensor in row-major order (an FSDP shard's rows).
void read_f32_range(const SafetensorsEntry& entry, size_t first, size_t count, float* dst);
// The same into `dst_dtype` (F32, BF16 or F16): the stored bits when the dtypes match, else
// converted, rounded to nearest even where it narrows (bf16 inference's weights, infer/weights.h).
void read_range_as(const SafetensorsEntry& entry, size_t first, size_t count, DType dst_dtype,
                   void* dst);

}  // namespace titan
