#include "titan/io/safetensors_header.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/io/json_util.h"

namespace titan {
namespace {

using json = nlohmann::json;

// Spec §9's list plus the byte-sized types newer safetensors releases added. Sub-byte types
// (F4, F6_*) are refused as unknown: their byte size is not shape x element size.
constexpr SafetensorsDTypeInfo kDTypes[] = {
    {"F64", 8, std::nullopt},         {"F32", 4, DType::f32},
    {"F16", 2, DType::f16},           {"BF16", 2, DType::bf16},
    {"I64", 8, DType::i64},           {"I32", 4, DType::i32},
    {"I16", 2, std::nullopt},         {"I8", 1, std::nullopt},
    {"U64", 8, std::nullopt},         {"U32", 4, std::nullopt},
    {"U16", 2, std::nullopt},         {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt},        {"F8_E5M2", 1, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},     {"F8_E5M2FNUZ", 1, std::nullopt},
    {"F8_E4M3FNUZ", 1, std::nullopt}, {"F8_E8M0", 1, std::nullopt},
    {"C64", 8, std::nullopt},
};

// The reference reader's limit: a larger header is refused before any JSON is read.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// {name: {field: [dim, ...]}} is three levels below the top object; anything deeper is not a
// safetensors header, and refusing it early bounds the parser's work on hostile input.
constexpr int kMaxDepth = 3;

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t unsigned_field(const json& value, const std::string& file, const std::string& tensor,
                        const char* field) {
  TITAN_CHECK(value.is_number_unsigned(), file, ": tensor ", json_quote(tensor), ": ", field,
              " holds ", json_excerpt(value), ", not a non-negative integer");
  return value.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const json& value, const std::string& file) {
  const std::string where = file + ": tensor " + json_quote(name);
  TITAN_CHECK(value.is_object(), where, ": entry is ", value.type_name(), ", not an object");
  SafetensorsEntry e;
  e.name = name;
  e.file = file;
  const SafetensorsDTypeInfo* info = nullptr;
  bool has_shape = false;
  bool has_offsets = false;
  uint64_t begin = 0;
  uint64_t end = 0;
  for (const auto& [field, v] : value.items()) {
    if (field == "dtype") {
      TITAN_CHECK(v.is_string(), where, ": dtype is ", v.type_name(), ", not a string");
      info = find_safetensors_dtype(v.get_ref<const std::string&>());
      TITAN_CHECK(info != nullptr, where, ": unknown dtype ", json_quote(v.get<std::string>()));
    } else if (field == "shape") {
      TITAN_CHECK(v.is_array(), where, ": shape is ", v.type_name(), ", not an array");
      for (const json& d : v) {
        const uint64_t dim = unsigned_field(d, file, name, "shape");
        TITAN_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where,
                    ": shape dimension ", dim, " is too large");
        e.shape.push_back(static_cast<int64_t>(dim));
      }
      has_shape = true;
    } else if (field == "data_offsets") {
      TITAN_CHECK(v.is_array() && v.size() == 2, where, ": data_offsets must be [begin, end], got ",
                  json_excerpt(v));
      begin = unsigned_field(v[0], file, name, "data_offsets");
      end = unsigned_field(v[1], file, name, "data_offsets");
      has_offsets = true;
    } else {
      fail(where, ": unknown field ", json_quote(field));
    }
  }
  TITAN_CHECK(info != nullptr, where, ": dtype is missing");
  TITAN_CHECK(has_shape, where, ": shape is missing");
  TITAN_CHECK(has_offsets, where, ": data_offsets is missing");
  TITAN_CHECK(begin <= end, where, ": data_offsets [", begin, ", ", end,
              "] are out of order (end before begin)");
  e.dtype_name = info->name;
  e.dtype = info->dtype;
  // prod(shape) * element size, refusing overflow rather than wrapping to a small size.
  uint64_t bytes = info->size;
  for (int64_t d : e.shape) {
    TITAN_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes), where, ": shape ",
                shape_str(e.shape), " overflows the addressable size");
  }
  TITAN_CHECK(end - begin == bytes, where, ": shape ", shape_str(e.shape), " with dtype ",
              info->name, " needs ", bytes, " bytes but data_offsets [", begin, ", ", end,
              "] span ", end - begin);
  e.begin = static_cast<size_t>(begin);
  e.nbytes = static_cast<size_t>(bytes);
  return e;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& file) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  TITAN_CHECK(value.is_object(), file, ": __metadata__ is ", value.type_name(),
              ", not an object of strings");
  for (const auto& [key, v] : value.items()) {
    TITAN_CHECK(v.is_string(), file, ": __metadata__ ", json_quote(key), " is ", v.type_name(),
                ", not a string");
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

}  // namespace

const SafetensorsDTypeInfo* find_safetensors_dtype(std::string_view name) {
  for (const SafetensorsDTypeInfo& info : kDTypes) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(const void* bytes, size_t size,
                                           const std::string& file_name) {
  const std::string& file = file_name;
  const auto* p = static_cast<const unsigned char*>(bytes);
  TITAN_CHECK(size >= 8, file, ": truncated: ", size,
              " bytes, shorter than the 8-byte header length of a safetensors file");
  const uint64_t n = read_u64_le(p);
  TITAN_CHECK(n <= kMaxHeaderBytes, file, ": header length ", n, " exceeds the limit of ",
              kMaxHeaderBytes, " bytes");
  TITAN_CHECK(n <= size - 8, file, ": header length ", n, " exceeds the file size (", size,
              " bytes); the file is truncated or not safetensors");
  TITAN_CHECK(n > 0 && p[8] == '{', file, ": safetensors header does not start with '{'");
  const auto* text = reinterpret_cast<const char*>(p + 8);
  const json header = parse_json_strict(std::string_view(text, static_cast<size_t>(n)), file,
                                        "safetensors header", kMaxDepth);
  TITAN_CHECK(header.is_object(), file, ": safetensors header is ", header.type_name(),
              ", not an object");

  SafetensorsHeader result;
  result.data_start = static_cast<size_t>(8 + n);
  const size_t buffer_bytes = size - result.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      result.metadata = parse_metadata(value, file);
    } else {
      result.entries.push_back(parse_entry(key, value, file));
    }
  }
  // Writers may list tensors in any order; the data must still tile the buffer exactly.
  std::stable_sort(result.entries.begin(), result.entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.nbytes < b.nbytes;
                   });
  size_t expected = 0;
  for (const SafetensorsEntry& e : result.entries) {
    TITAN_CHECK(e.begin <= buffer_bytes && e.nbytes <= buffer_bytes - e.begin, file, ": tensor ",
                json_quote(e.name), ": data_offsets [", e.begin, ", ", e.begin + e.nbytes,
                "] lie outside the data buffer of ", buffer_bytes, " bytes (file truncated?)");
    TITAN_CHECK(e.begin >= expected, file, ": tensor ", json_quote(e.name), ": data_offsets [",
                e.begin, ", ", e.begin + e.nbytes, "] overlap the previous tensor, which ends at ",
                expected);
    TITAN_CHECK(e.begin == expected, file, ": tensor ", json_quote(e.name), ": data_offsets [",
                e.begin, ", ", e.begin + e.nbytes, "] leave a gap after byte ", expected);
    expected = e.begin + e.nbytes;
  }
  TITAN_CHECK(expected == buffer_bytes, file, ": tensors end at byte ", expected,
              " of the data buffer but it holds ", buffer_bytes, " bytes (trailing data)");
  return result;
}

}  // namespace titan
