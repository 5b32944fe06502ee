// Helpers shared by the safetensors tests: scratch folders (scratch_dir.h), raw files,
// error-message checks, and the fp32 test values.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "titan/core/error.h"
#include "titan/core/tensor.h"

namespace titan::test {

inline std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from its parts: u64 LE length of `header` (unpadded), header, data.
inline std::vector<unsigned char> raw_safetensors(const std::string& header,
                                                  const std::vector<unsigned char>& data,
                                                  uint64_t length_field) {
  std::vector<unsigned char> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(length_field >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

inline std::vector<unsigned char> raw_safetensors(const std::string& header,
                                                  const std::vector<unsigned char>& data) {
  return raw_safetensors(header, data, header.size());
}

// `fn` must throw titan::Error whose message is one line containing every string in `parts`.
inline void expect_error(const std::function<void()>& fn,
                         std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no titan::Error thrown; expected one mentioning " << *parts.begin();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
    for (const std::string& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' missing in: " << what;
    }
  }
}

// values[i] = (i * 37 % 101 - 50) / 8 + offset: varied, exactly representable in fp32; the same
// values as values() in tests/reference/safetensors_roundtrip.py.
inline Tensor f32_tensor(const Shape& shape, float offset = 0.0f) {
  Tensor t = Tensor::empty(shape, DType::f32, MemCategory::other);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = static_cast<float>(i * 37 % 101 - 50) / 8.0f + offset;
  }
  return t;
}

// Ties, overflow to inf in f16, signed zero, a subnormal, NaN: what every float conversion must
// round as torch does. SPECIAL in tests/reference/safetensors_roundtrip.py is the same list.
inline const std::vector<float> kSpecialFloats = {0.0f,
                                                  -0.0f,
                                                  1.0f + 1.0f / 256,
                                                  1.0f + 3.0f / 256,
                                                  65520.0f,
                                                  1e-7f,
                                                  -2.5f,
                                                  std::numeric_limits<float>::infinity(),
                                                  std::nanf("")};

// kSpecialFloats as a 1-D fp32 tensor.
inline Tensor special_f32_tensor() {
  Tensor t =
      Tensor::empty({static_cast<int64_t>(kSpecialFloats.size())}, DType::f32, MemCategory::other);
  std::memcpy(t.raw(), kSpecialFloats.data(), t.nbytes());
  return t;
}

}  // namespace titan::test
