// Writing safetensors files and Hugging Face model-folder checkpoints (single file or shards with
// model.safetensors.index.json), each file atomically (atomic_file.h).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/progress.h"
#include "titan/core/tensor.h"

namespace titan {

struct SafetensorsTensor {
  std::string name;  // HF state-dict key
  Tensor tensor;     // contiguous
};

struct SafetensorsWriteOptions {
  // Store every floating-point tensor (F32, BF16, F16) as this type, rounding to nearest even;
  // nullopt keeps each tensor's own type. Integer tensors are always stored as they are.
  std::optional<DType> float_dtype;
  // A shard is closed before it would exceed this many data bytes; a tensor larger than this
  // gets a shard of its own. HF's default "5GB" (decimal, as HF parses it).
  size_t max_shard_bytes = 5'000'000'000;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Advanced by each tensor's stored bytes as it is written (a status line for big saves).
  Progress* progress = nullptr;
  // Called with a tensor's index in the caller's list just before its data are first read, once
  // the reads of every tensor before it are done (the export brings a sharded unit whole here and
  // hands the previous one back). Tensors are read in safetensors_read_order.
  std::function<void(size_t index)> before_read;
  // Set when the tensors' data are a device's memory, which the host cannot read: each tensor is
  // copied by it (host_dst, device src, bytes) into one host buffer the size of the largest
  // tensor, made in `staging_memory`, just before it is written (after before_read), so a save
  // from a device holds one tensor on the host at a time.
  std::function<void(void* host_dst, const void* src, size_t bytes)> copy_to_host;
  // Where that buffer is made: the backend's pinned host memory where it has some (faster
  // device-to-host copies); null for host_memory().
  MemorySpace* staging_memory = nullptr;
};

// Bytes converted per write() call: big enough for few syscalls, small enough to stay in cache.
// A file being written holds two such staging buffers (accounted as "other"; one converts while
// the other is written), which titan plan counts.
constexpr size_t kSafetensorsStagingBytes = size_t{16} << 20;

// One safetensors file at `path`. Tensors are laid out in the reference writer's order (element
// size descending, then name), the header padded with spaces to a multiple of 8 bytes. Throws
// titan::Error on duplicate names, non-contiguous tensors or I/O failure; the destination is
// then untouched.
void write_safetensors_file(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                            const SafetensorsWriteOptions& options);

// The order write_safetensors_file reads `tensors` in (indices into them): its layout order. Only
// names, shapes and dtypes are looked at, so the tensors need no data.
std::vector<size_t> safetensors_file_read_order(const std::vector<SafetensorsTensor>& tensors,
                                                const SafetensorsWriteOptions& options);

// A checkpoint in folder `dir` (created if needed): model.safetensors when all data fit in one
// shard, else model-0000i-of-0000K.safetensors filled in the order given, then
// model.safetensors.index.json (total_size = data bytes, weight_map sorted by name). A stale
// index or single file from an earlier export of the other kind is removed afterwards, so the
// folder never offers two checkpoints. Returns the file names written, relative to `dir`.
std::vector<std::string> write_safetensors_checkpoint(const std::string& dir,
                                                      const std::vector<SafetensorsTensor>& tensors,
                                                      const SafetensorsWriteOptions& options);

// The order write_safetensors_checkpoint reads `tensors` in (indices into them): file by file,
// each file's tensors in its layout order. Only names, shapes and dtypes are looked at, so the
// tensors need no data.
std::vector<size_t> safetensors_read_order(const std::vector<SafetensorsTensor>& tensors,
                                           const SafetensorsWriteOptions& options);

}  // namespace titan
