#include "titan/io/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <set>

#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/io/atomic_file.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

DType stored_dtype(const Tensor& t, const SafetensorsWriteOptions& options) {
  return options.float_dtype && is_float(t.dtype()) ? *options.float_dtype : t.dtype();
}

size_t stored_bytes(const Tensor& t, const SafetensorsWriteOptions& options) {
  return static_cast<size_t>(t.numel()) * dtype_size(stored_dtype(t, options));
}

// The header: {"__metadata__": {...}, name: {"dtype", "shape", "data_offsets"}, ...} in data
// order, padded with spaces so the data start at a multiple of 8 bytes.
std::string header_text(const std::vector<const SafetensorsTensor*>& order,
                        const SafetensorsWriteOptions& options) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!options.metadata.empty()) header["__metadata__"] = options.metadata;
  size_t offset = 0;
  for (const SafetensorsTensor* t : order) {
    const size_t bytes = stored_bytes(t->tensor, options);
    header[t->name] = {{"dtype", dtype_name(stored_dtype(t->tensor, options))},
                       {"shape", t->tensor.shape()},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Tensor bytes go out through two staging buffers: while a helper thread write()s one chunk,
// the OpenMP threads convert the next, so conversion hides behind the kernel's copy into the page
// cache. At most one write is in flight, which keeps the chunks in order.
class DataWriter {
 public:
  explicit DataWriter(AtomicFile& out)
      : out_(out),
        staging_{Buffer(host_memory(), kSafetensorsStagingBytes, MemCategory::other),
                 Buffer(host_memory(), kSafetensorsStagingBytes, MemCategory::other)} {}
  ~DataWriter() {
    if (pending_.valid()) pending_.wait();  // never leave a thread writing into a freed buffer
  }

  void write(const Tensor& t, DType dtype) {
    const size_t n = static_cast<size_t>(t.numel());
    const auto* src = static_cast<const unsigned char*>(t.raw());
    if (dtype == t.dtype()) {
      issue(src, t.nbytes());
      return;
    }
    const size_t src_size = dtype_size(t.dtype());
    const size_t dst_size = dtype_size(dtype);
    const size_t per_chunk = kSafetensorsStagingBytes / dst_size;
    for (size_t begin = 0; begin < n; begin += per_chunk) {
      const size_t len = std::min(per_chunk, n - begin);
      Buffer& buffer = staging_[next_];
      next_ ^= 1;
      // The buffer's previous write finished: issue() waits before starting the next one.
      convert_float(src + begin * src_size, t.dtype(), len, buffer.data(), dtype);
      issue(buffer.data(), len * dst_size);
    }
  }

  void finish() {
    if (pending_.valid()) pending_.get();
  }

 private:
  void issue(const void* data, size_t bytes) {
    if (pending_.valid()) pending_.get();  // rethrows a failed write
    pending_ = std::async(std::launch::async, [this, data, bytes] { out_.write(data, bytes); });
  }

  AtomicFile& out_;
  Buffer staging_[2];
  int next_ = 0;
  std::future<void> pending_;
};

void check_tensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                   const SafetensorsWriteOptions& options) {
  TITAN_CHECK(!options.float_dtype || is_float(*options.float_dtype), path,
              ": cannot store floating-point tensors as ", dtype_name(*options.float_dtype));
  std::set<std::string_view> names;
  for (const SafetensorsTensor& t : tensors) {
    TITAN_CHECK(t.name != "__metadata__", path, ": a tensor cannot be named __metadata__");
    TITAN_CHECK(names.insert(t.name).second, path, ": tensor ", json_quote(t.name),
                " is given twice");
    TITAN_CHECK(t.tensor.defined() && t.tensor.is_contiguous(), path, ": tensor ",
                json_quote(t.name), " is not a contiguous tensor with data");
  }
}

// The reference writer's layout: larger elements first keeps every tensor aligned to its element
// size; the name breaks ties, so the bytes do not depend on the caller's order.
std::vector<const SafetensorsTensor*> layout_order(
    const std::vector<const SafetensorsTensor*>& tensors, const SafetensorsWriteOptions& options) {
  std::vector<const SafetensorsTensor*> order = tensors;
  std::sort(order.begin(), order.end(),
            [&](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              const size_t sa = dtype_size(stored_dtype(a->tensor, options));
              const size_t sb = dtype_size(stored_dtype(b->tensor, options));
              return sa != sb ? sa > sb : a->name < b->name;
            });
  return order;
}

// `first`: the caller's first tensor, from which before_read's indices count.
void write_file(const std::string& path, const std::vector<const SafetensorsTensor*>& tensors,
                const SafetensorsWriteOptions& options, const SafetensorsTensor* first) {
  const std::vector<const SafetensorsTensor*> order = layout_order(tensors, options);
  const std::string header = header_text(order, options);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));

  size_t file_bytes = sizeof length + header.size();
  for (const SafetensorsTensor* t : order) file_bytes += stored_bytes(t->tensor, options);
  AtomicFile out(path);
  out.reserve(file_bytes);
  out.write(length, sizeof length);
  out.write(header.data(), header.size());
  DataWriter data(out);
  Buffer device_staging;  // with copy_to_host: the tensor being written, copied from the device
  if (options.copy_to_host) {
    size_t largest = 0;
    for (const SafetensorsTensor* t : order) largest = std::max(largest, t->tensor.nbytes());
    MemorySpace& space =
        options.staging_memory != nullptr ? *options.staging_memory : host_memory();
    device_staging = Buffer(space, largest, MemCategory::other);
  }
  for (const SafetensorsTensor* t : order) {
    if (options.before_read || options.copy_to_host) {
      // A write in flight may still read the tensor before (or the staging buffer it was in).
      data.finish();
    }
    if (options.before_read) options.before_read(static_cast<size_t>(t - first));
    Tensor source = t->tensor;
    if (options.copy_to_host) {
      options.copy_to_host(device_staging.data(), t->tensor.raw(), t->tensor.nbytes());
      source = Tensor::view(device_staging.data(), t->tensor.shape(), t->tensor.dtype());
    }
    data.write(source, stored_dtype(t->tensor, options));
    if (options.progress != nullptr) {
      options.progress->advance(static_cast<int64_t>(stored_bytes(t->tensor, options)));
    }
  }
  data.finish();
  out.commit();
}

// The checkpoint's files, filled in the caller's order (model order keeps a layer's tensors
// together): a file is closed before it would exceed max_shard_bytes.
std::vector<std::vector<const SafetensorsTensor*>> shard_files(
    const std::vector<SafetensorsTensor>& tensors, const SafetensorsWriteOptions& options) {
  std::vector<std::vector<const SafetensorsTensor*>> shards(1);
  size_t shard_bytes = 0;
  for (const SafetensorsTensor& t : tensors) {
    const size_t bytes = stored_bytes(t.tensor, options);
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += bytes;
  }
  return shards;
}

std::string shard_name(size_t i, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, count);
  return name;
}

void remove_if_present(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
  TITAN_CHECK(!ec, path.string(), ": cannot remove the stale file: ", ec.message());
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                            const SafetensorsWriteOptions& options) {
  check_tensors(path, tensors, options);
  std::vector<const SafetensorsTensor*> all;
  for (const SafetensorsTensor& t : tensors) all.push_back(&t);
  write_file(path, all, options, tensors.data());
}

std::vector<size_t> safetensors_file_read_order(const std::vector<SafetensorsTensor>& tensors,
                                                const SafetensorsWriteOptions& options) {
  std::vector<const SafetensorsTensor*> all;
  for (const SafetensorsTensor& t : tensors) all.push_back(&t);
  std::vector<size_t> order;
  for (const SafetensorsTensor* t : layout_order(all, options)) {
    order.push_back(static_cast<size_t>(t - tensors.data()));
  }
  return order;
}

std::vector<std::string> write_safetensors_checkpoint(const std::string& dir,
                                                      const std::vector<SafetensorsTensor>& tensors,
                                                      const SafetensorsWriteOptions& options) {
  check_tensors(dir, tensors, options);
  TITAN_CHECK(options.max_shard_bytes > 0, dir, ": the shard size must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  TITAN_CHECK(!ec, dir, ": cannot create the folder: ", ec.message());

  const std::vector<std::vector<const SafetensorsTensor*>> shards = shard_files(tensors, options);
  size_t total_bytes = 0;
  for (const SafetensorsTensor& t : tensors) total_bytes += stored_bytes(t.tensor, options);

  const fs::path folder(dir);
  if (shards.size() == 1) {
    write_file((folder / "model.safetensors").string(), shards[0], options, tensors.data());
    remove_if_present(folder / "model.safetensors.index.json");
    return {"model.safetensors"};
  }
  std::vector<std::string> written;
  nlohmann::json weight_map = nlohmann::json::object();  // std::map underneath: sorted keys
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(i, shards.size());
    write_file((folder / name).string(), shards[i], options, tensors.data());
    for (const SafetensorsTensor* t : shards[i]) weight_map[t->name] = name;
    written.push_back(name);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                {"weight_map", weight_map}};
  // The index goes last: it appears only once every shard it names is in place.
  write_file_atomic((folder / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  written.push_back("model.safetensors.index.json");
  remove_if_present(folder / "model.safetensors");
  return written;
}

std::vector<size_t> safetensors_read_order(const std::vector<SafetensorsTensor>& tensors,
                                           const SafetensorsWriteOptions& options) {
  std::vector<size_t> order;
  for (const std::vector<const SafetensorsTensor*>& file : shard_files(tensors, options)) {
    for (const SafetensorsTensor* t : layout_order(file, options)) {
      order.push_back(static_cast<size_t>(t - tensors.data()));
    }
  }
  return order;
}

}  // namespace titan
