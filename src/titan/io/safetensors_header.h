// The safetensors header (spec §9): an 8-byte little-endian length N, N bytes of JSON naming each
// tensor's dtype, shape and byte range, then the data buffer. The parser here is the one the
// reader uses and the one the fuzz test drives, so every check lives in one place.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/core/tensor.h"

namespace titan {

// A dtype a safetensors file may name. Only some have a titan DType; the others (BOOL, U8, F64,
// FP8, ...) are recognised so a file holding them opens, but cannot be converted.
struct SafetensorsDTypeInfo {
  std::string_view name;  // "BF16"
  size_t size;            // bytes per element
  std::optional<DType> dtype;
};

// nullptr when `name` is not a dtype this reader knows.
const SafetensorsDTypeInfo* find_safetensors_dtype(std::string_view name);

struct SafetensorsEntry {
  std::string name;
  std::string_view dtype_name;  // as in the file ("BF16"), static storage
  std::optional<DType> dtype;   // nullopt for dtypes titan does not compute in
  Shape shape;
  size_t begin = 0;            // offset of the first byte in the data buffer (after the header)
  size_t nbytes = 0;           // prod(shape) * element size
  const void* data = nullptr;  // set by the reader: the tensor's bytes inside the mapping
  std::string file;            // the file it lives in, for error messages

  int64_t numel() const { return shape_numel(shape); }
};

struct SafetensorsHeader {
  size_t data_start = 0;                        // 8 + N: file offset of the data buffer
  std::vector<SafetensorsEntry> entries;        // in data order (sorted by begin offset)
  std::map<std::string, std::string> metadata;  // "__metadata__", e.g. {"format": "pt"}
};

// Parses and validates the header of a file whose first `size` bytes (the whole file) are at
// `bytes`: length within the file and at most 100,000,000; a JSON object with no duplicate keys;
// known dtypes; sizes that match shape x dtype; byte ranges that tile the data buffer exactly
// (first at 0, no gap, no overlap, last ending at the file's end). Entries' `data` stay null.
// Any violation throws titan::Error naming `file_name`, the tensor or field, and the problem.
SafetensorsHeader parse_safetensors_header(const void* bytes, size_t size,
                                           const std::string& file_name);

}  // namespace titan
