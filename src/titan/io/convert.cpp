#include "titan/io/convert.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "titan/core/error.h"

namespace titan {
namespace {

// Work per thread per chunk: large enough to amortise scheduling, small enough that both cores
// stay busy on the small tensors (norm weights) of a checkpoint.
constexpr size_t kChunk = 1 << 16;
// Below this, starting threads costs more than it saves.
constexpr size_t kParallelMin = 1 << 18;

bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// body(begin, end) over [0, n), in chunks spread across the threads.
template <typename Body>
void for_chunks(size_t n, const Body& body) {
  if (n < kParallelMin) {
    body(size_t{0}, n);
    return;
  }
  const auto chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    body(begin, std::min(n, begin + kChunk));
  }
}

// The loops below read 16-bit values with memcpy: the source may be unaligned, and the compiler
// turns these into plain vector loads.
void bf16_to_f32_range(const unsigned char* src, float* dst, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

void f32_to_bf16_range(const float* src, unsigned char* dst, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

void f16_to_f32_range(const unsigned char* src, float* dst, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = f16_to_f32(h);
  }
}

void f32_to_f16_range(const float* src, unsigned char* dst, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const uint16_t h = f32_to_f16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

// Non-finite: every exponent bit set (IEEE), for `Bits` values whose exponent field is `mask`.
template <typename Bits, Bits mask>
size_t count_nonfinite_bits(const unsigned char* data, size_t n) {
  const auto count_range = [&](size_t begin, size_t end) {
    size_t count = 0;
    for (size_t i = begin; i < end; ++i) {
      Bits b;
      std::memcpy(&b, data + sizeof(Bits) * i, sizeof(Bits));
      count += (b & mask) == mask;
    }
    return count;
  };
  if (n < kParallelMin) return count_range(0, n);
  const auto chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  size_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    total += count_range(begin, std::min(n, begin + kChunk));
  }
  return total;
}

}  // namespace

size_t count_nonfinite(const void* data, DType dtype, size_t n) {
  const auto* d = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case DType::f32:
      return count_nonfinite_bits<uint32_t, 0x7f800000u>(d, n);
    case DType::bf16:
      return count_nonfinite_bits<uint16_t, 0x7f80u>(d, n);
    case DType::f16:
      return count_nonfinite_bits<uint16_t, 0x7c00u>(d, n);
    default:
      fail("cannot check ", dtype_name(dtype), " values for NaN: not a floating-point type");
  }
}

void convert_to_f32(const void* src, DType src_dtype, size_t n, float* dst) {
  const auto* s = static_cast<const unsigned char*>(src);
  switch (src_dtype) {
    case DType::f32:
      for_chunks(n, [&](size_t b, size_t e) { std::memcpy(dst + b, s + 4 * b, 4 * (e - b)); });
      return;
    case DType::bf16:
      for_chunks(n, [&](size_t b, size_t e) { bf16_to_f32_range(s, dst, b, e); });
      return;
    case DType::f16:
      for_chunks(n, [&](size_t b, size_t e) { f16_to_f32_range(s, dst, b, e); });
      return;
    default:
      fail("cannot convert ", dtype_name(src_dtype), " to F32: not a floating-point type");
  }
}

void convert_from_f32(const float* src, size_t n, DType dst_dtype, void* dst) {
  auto* d = static_cast<unsigned char*>(dst);
  switch (dst_dtype) {
    case DType::f32:
      for_chunks(n, [&](size_t b, size_t e) { std::memcpy(d + 4 * b, src + b, 4 * (e - b)); });
      return;
    case DType::bf16:
      for_chunks(n, [&](size_t b, size_t e) { f32_to_bf16_range(src, d, b, e); });
      return;
    case DType::f16:
      for_chunks(n, [&](size_t b, size_t e) { f32_to_f16_range(src, d, b, e); });
      return;
    default:
      fail("cannot convert F32 to ", dtype_name(dst_dtype), ": not a floating-point type");
  }
}

void convert_float(const void* src, DType src_dtype, size_t n, void* dst, DType dst_dtype) {
  TITAN_CHECK(is_float(src_dtype) && is_float(dst_dtype), "cannot convert ", dtype_name(src_dtype),
              " to ", dtype_name(dst_dtype), ": only F32, BF16 and F16 convert");
  if (src_dtype == dst_dtype) {
    const size_t size = dtype_size(src_dtype);
    const auto* s = static_cast<const unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    for_chunks(
        n, [&](size_t b, size_t e) { std::memcpy(d + size * b, s + size * b, size * (e - b)); });
  } else if (src_dtype == DType::f32) {
    convert_from_f32(static_cast<const float*>(src), n, dst_dtype, dst);
  } else if (dst_dtype == DType::f32) {
    convert_to_f32(src, src_dtype, n, static_cast<float*>(dst));
  } else {
    // bf16 <-> f16: through an fp32 staging buffer, chunk by chunk.
    const auto* s = static_cast<const unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    std::vector<float> staging(std::min(n, kParallelMin));
    for (size_t b = 0; b < n; b += staging.size()) {
      const size_t len = std::min(staging.size(), n - b);
      convert_to_f32(s + 2 * b, src_dtype, len, staging.data());
      convert_from_f32(staging.data(), len, dst_dtype, d + 2 * b);
    }
  }
}

}  // namespace titan
