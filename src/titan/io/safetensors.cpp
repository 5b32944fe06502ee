#include "titan/io/safetensors.h"

#include <filesystem>
#include <set>

#include "titan/core/error.h"
#include "titan/io/atomic_dir.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Shard names come from a file we did not write: keep them inside the checkpoint's folder.
bool is_safe_relative(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

// weight_map: tensor name -> shard file name, checked to be strings.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const nlohmann::json index = read_json_file(index_path, "safetensors index", 4);
  TITAN_CHECK(index.is_object(), index_path, ": safetensors index is ", index.type_name(),
              ", not an object");
  const auto it = index.find("weight_map");
  TITAN_CHECK(it != index.end(), index_path, ": weight_map is missing");
  TITAN_CHECK(it->is_object(), index_path, ": weight_map is ", it->type_name(), ", not an object");
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : it->items()) {
    TITAN_CHECK(shard.is_string(), index_path, ": weight_map entry ", json_quote(name), " is ",
                shard.type_name(), ", not a file name");
    const auto& file = shard.get_ref<const std::string&>();
    TITAN_CHECK(is_safe_relative(file), index_path, ": weight_map entry ", json_quote(name),
                " names the shard ", json_quote(file), ", which is not a file inside the folder");
    weight_map.emplace(name, file);
  }
  return weight_map;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  f.header_ = parse_safetensors_header(f.file_.data(), f.file_.size(), path);
  const unsigned char* data = f.file_.data() + f.header_.data_start;
  for (size_t i = 0; i < f.header_.entries.size(); ++i) {
    SafetensorsEntry& e = f.header_.entries[i];
    e.data = data + e.begin;
    f.index_.emplace(e.name, i);
  }
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.entries[it->second];
}

void SafetensorsFile::prefetch() const {
  file_.advise_willneed(header_.data_start, file_.size() - header_.data_start);
}

bool SafetensorsCheckpoint::in_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kIndexName, ec) ||
         fs::is_regular_file(fs::path(dir) / kSingleName, ec);
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
  SafetensorsCheckpoint ckpt;
  std::string index_path;
  std::string single_path;
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / kIndexName)) {
      index_path = (fs::path(path) / kIndexName).string();
    } else {
      single_path = (fs::path(path) / kSingleName).string();
      TITAN_CHECK(fs::exists(single_path), path, ": no ", kIndexName, " and no ", kSingleName,
                  " in the folder");
    }
  } else if (path.ends_with(".json")) {
    index_path = path;
  } else {
    single_path = path;
  }

  // A folder titan wrote records each file's checksum (io/atomic_dir.h): damaged bytes are named
  // before anything is parsed.
  if (!single_path.empty()) {
    ckpt.path_ = single_path;
    const fs::path single(single_path);
    check_titan_folder_checksums(single.parent_path().string(), {single.filename().string()});
    ckpt.files_.push_back(SafetensorsFile::open(single_path));
    for (const SafetensorsEntry& e : ckpt.files_.back().entries())
      ckpt.by_name_.emplace(e.name, &e);
    return ckpt;
  }

  ckpt.path_ = index_path;
  const fs::path dir = fs::path(index_path).parent_path();
  check_titan_folder_checksums(dir.string(), {fs::path(index_path).filename().string()});
  const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) shards.insert(shard);
  for (const std::string& shard : shards) {
    const std::string shard_path = (dir / shard).string();
    TITAN_CHECK(fs::exists(shard_path), index_path, ": shard ", json_quote(shard),
                " named by the index is missing (", shard_path, ")");
  }
  check_titan_folder_checksums(dir.string(), {shards.begin(), shards.end()});
  for (const std::string& shard : shards) {
    ckpt.files_.push_back(SafetensorsFile::open((dir / shard).string()));
  }
  // Every tensor of every shard is listed by the index, in that shard, exactly once.
  for (size_t i = 0; const std::string& shard : shards) {
    for (const SafetensorsEntry& e : ckpt.files_[i++].entries()) {
      const auto listed = weight_map.find(e.name);
      TITAN_CHECK(listed != weight_map.end(), index_path, ": tensor ", json_quote(e.name),
                  " in shard ", json_quote(shard), " is not listed in the index");
      TITAN_CHECK(listed->second == shard, index_path, ": tensor ", json_quote(e.name),
                  " is in shard ", json_quote(shard), " but the index names ",
                  json_quote(listed->second));
      ckpt.by_name_.emplace(e.name, &e);
    }
  }
  for (const auto& [name, shard] : weight_map) {
    TITAN_CHECK(ckpt.by_name_.contains(name), index_path, ": tensor ", json_quote(name),
                " is listed in the index but missing from shard ", json_quote(shard));
  }
  return ckpt;
}

const SafetensorsEntry* SafetensorsCheckpoint::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const SafetensorsEntry& SafetensorsCheckpoint::at(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  TITAN_CHECK(e != nullptr, path_, ": tensor ", json_quote(name), " is missing");
  return *e;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, entry] : by_name_) names.push_back(name);
  return names;
}

size_t SafetensorsCheckpoint::data_bytes() const {
  size_t total = 0;
  for (const auto& [name, entry] : by_name_) total += entry->nbytes;
  return total;
}

void read_f32(const SafetensorsEntry& entry, float* dst, size_t numel) {
  TITAN_CHECK(static_cast<size_t>(entry.numel()) == numel, entry.file, ": tensor ",
              json_quote(entry.name), " has ", entry.numel(), " elements (shape ",
              shape_str(entry.shape), "), expected ", numel);
  read_f32_range(entry, 0, numel, dst);
}

void read_f32_range(const SafetensorsEntry& entry, size_t first, size_t count, float* dst) {
  read_range_as(entry, first, count, DType::f32, dst);
}

void read_range_as(const SafetensorsEntry& entry, size_t first, size_t count, DType dst_dtype,
                   void* dst) {
  TITAN_CHECK(first + count <= static_cast<size_t>(entry.numel()), entry.file, ": tensor ",
              json_quote(entry.name), " has ", entry.numel(), " elements, not [", first, ", ",
              first + count, ")");
  TITAN_CHECK(entry.dtype == DType::f32 || entry.dtype == DType::bf16 || entry.dtype == DType::f16,
              entry.file, ": tensor ", json_quote(entry.name), " has dtype ", entry.dtype_name,
              "; only F32, BF16 and F16 load as floats");
  const auto* bytes = static_cast<const unsigned char*>(entry.data);
  convert_float(bytes + first * dtype_size(*entry.dtype), *entry.dtype, count, dst, dst_dtype);
}

}  // namespace titan
