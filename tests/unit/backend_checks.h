// Checks any backend passes, run on the CPU by test_backend and on a GPU by titan_cuda_smoke: GEMMs
// against the fp64-sum reference for every transpose pair, and copies through device memory.
// Each returns "" or the first failure in words.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "titan/backend/device_buffer.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/allocator.h"
#include "titan/core/dtype.h"

namespace titan::testing {

inline std::vector<float> uniform_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;  // [-1, 1)
  }
  return v;
}

template <typename T>
DeviceBuffer to_device(Backend& be, const std::vector<T>& host, DType dtype) {
  DeviceBuffer buf(be, static_cast<int64_t>(host.size()), dtype, MemCategory::other);
  copy_from_host(buf, host.data(), dtype, static_cast<int64_t>(host.size()));
  return buf;
}

// The backend entry points a GEMM check calls.
enum class GemmRoute { f32, f32_block, bf16, bf16_to_bf16 };

inline const char* gemm_route_name(GemmRoute route) {
  switch (route) {
    case GemmRoute::f32:
      return "gemm_f32";
    case GemmRoute::f32_block:
      return "gemm_f32_block";
    case GemmRoute::bf16:
      return "gemm_bf16";
    case GemmRoute::bf16_to_bf16:
      return "gemm_bf16_to_bf16";
  }
  return "?";
}

// C = 0.5 op(A) op(B) + C with odd sizes and padded leading dimensions (bf16_to_bf16: + 0 C, C
// written in bf16; C's rows padded by `c_padding`), fp32 or bf16 operands (a, b hold the operands'
// values in fp32, a16, b16 their bf16 bits), and the fp64-sum reference.
struct GemmCase {
  GemmRoute route;
  Trans ta, tb;
  int64_t m = 37, n = 29, k = 515, lda, ldb, ldc;
  float alpha = 0.5f, beta;
  // Unit roundoff of C's type: the most a correct rounding of the fp32 sum moves it, relative.
  double output_rounding;
  std::vector<float> a, b, c0, want;
  std::vector<uint16_t> a16, b16, c16;

  GemmCase(GemmRoute route_, Trans ta_, Trans tb_, int64_t c_padding = 2)
      : route(route_), ta(ta_), tb(tb_) {
    const bool bf16_operands = route == GemmRoute::bf16 || route == GemmRoute::bf16_to_bf16;
    const bool bf16_output = route == GemmRoute::bf16_to_bf16;
    beta = bf16_output ? 0.0f : 1.0f;
    output_rounding = bf16_output ? std::ldexp(1.0, -8) : 0.0;
    lda = (ta == Trans::no ? k : m) + 3;
    ldb = (tb == Trans::no ? n : k) + 5;
    ldc = n + c_padding;
    a = uniform_values((ta == Trans::no ? m : k) * lda, 1);
    b = uniform_values((tb == Trans::no ? k : n) * ldb, 2);
    c0 = uniform_values(m * ldc, 3);
    a16.resize(a.size());
    b16.resize(b.size());
    c16.resize(c0.size());
    if (bf16_operands) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_f32(a16[i] = f32_to_bf16(a[i]));
      for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_to_f32(b16[i] = f32_to_bf16(b[i]));
    }
    // A bf16 C's padding is compared exactly, so it starts as bf16 values.
    if (bf16_output) {
      for (size_t i = 0; i < c0.size(); ++i) c0[i] = bf16_to_f32(c16[i] = f32_to_bf16(c0[i]));
    }
    want = c0;
    gemm_f32_reference(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, want.data(),
                       ldc);
  }

  // Tolerance: the reference sums in fp64, so the error is the GEMM's fp32 accumulation: k
  // roundings of at most 2^-24 relative to the running sum, one more for each product (exact for
  // bf16 operands: 8-bit x 8-bit significands fit fp32's 24), for alpha and for adding beta * C,
  // plus the reference's own rounding to fp32. So |c - ref| <= (k + 4) 2^-24 (|alpha| sum_p
  // |a_ip b_pj| + |beta c_ij|), a worst-case bound that any fp32-accumulating order meets. bf16
  // operands are rounded before both sides see them, so bf16's 2^-9 never enters. A bf16 C adds
  // its one rounding of that sum: at most 2^-8 of it (bf16 keeps 8 significant bits), so a
  // truncating conversion (up to 2^-7) can fail. "" or the first element out of bound, named after
  // `gemm`.
  std::string compare(const std::vector<float>& got, const std::string& gemm) const {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float g = got[i * ldc + j], w = want[i * ldc + j];
        double bound = 0.0;  // the padding columns must come back untouched
        if (j < n) {
          double magnitude = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            const float av = ta == Trans::no ? a[i * lda + p] : a[p * lda + i];
            const float bv = tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p];
            magnitude += std::fabs(static_cast<double>(av) * bv);
          }
          bound = (k + 4) * std::ldexp(1.0, -24) *
                  (alpha * magnitude + beta * std::fabs(c0[i * ldc + j]));
          bound += output_rounding * (std::fabs(w) + bound);
        }
        if (!(std::fabs(static_cast<double>(g) - w) <= bound)) {
          char line[200];
          std::snprintf(line, sizeof line,
                        "%s %c%c: c[%lld,%lld] = %.9g, reference %.9g, bound %.3g", gemm.c_str(),
                        static_cast<char>(ta), static_cast<char>(tb), static_cast<long long>(i),
                        static_cast<long long>(j), g, w, bound);
          return line;
        }
      }
    }
    return "";
  }
};

inline std::string check_gemm(Backend& be, GemmRoute route, Trans ta, Trans tb, int64_t c_padding) {
  const GemmCase t(route, ta, tb, c_padding);
  std::vector<float> got(t.c0.size());
  if (route == GemmRoute::bf16_to_bf16) {
    DeviceBuffer c_dev = to_device(be, t.c16, DType::bf16);
    const DeviceBuffer a_dev = to_device(be, t.a16, DType::bf16),
                       b_dev = to_device(be, t.b16, DType::bf16);
    be.gemm_bf16_to_bf16(ta, tb, t.m, t.n, t.k, t.alpha, a_dev.as<uint16_t>(), t.lda,
                         b_dev.as<uint16_t>(), t.ldb, c_dev.as<uint16_t>(), t.ldc);
    std::vector<uint16_t> bits(got.size());
    copy_to_host(bits.data(), DType::bf16, static_cast<int64_t>(bits.size()), c_dev);
    std::transform(bits.begin(), bits.end(), got.begin(), bf16_to_f32);
  } else if (route == GemmRoute::bf16) {
    DeviceBuffer c_dev = to_device(be, t.c0, DType::f32);
    const DeviceBuffer a_dev = to_device(be, t.a16, DType::bf16),
                       b_dev = to_device(be, t.b16, DType::bf16);
    be.gemm_bf16(ta, tb, t.m, t.n, t.k, t.alpha, a_dev.as<uint16_t>(), t.lda, b_dev.as<uint16_t>(),
                 t.ldb, t.beta, c_dev.as<float>(), t.ldc);
    copy_to_host(got.data(), DType::f32, static_cast<int64_t>(got.size()), c_dev);
  } else {
    DeviceBuffer c_dev = to_device(be, t.c0, DType::f32);
    const DeviceBuffer a_dev = to_device(be, t.a, DType::f32),
                       b_dev = to_device(be, t.b, DType::f32);
    const auto gemm = route == GemmRoute::f32 ? &Backend::gemm_f32 : &Backend::gemm_f32_block;
    (be.*gemm)(ta, tb, t.m, t.n, t.k, t.alpha, a_dev.as<float>(), t.lda, b_dev.as<float>(), t.ldb,
               t.beta, c_dev.as<float>(), t.ldc);
    copy_to_host(got.data(), DType::f32, static_cast<int64_t>(got.size()), c_dev);
  }
  return t.compare(got, std::string(gemm_route_name(route)) + " on " + be.name());
}

inline std::string check_gemms(Backend& be) {
  for (GemmRoute route :
       {GemmRoute::f32, GemmRoute::f32_block, GemmRoute::bf16, GemmRoute::bf16_to_bf16}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        // C padded too, and C dense: oneDNN's brgemm takes only dense rows, so the CPU backend
        // copies small padded operands dense for it when C is dense (gemm_matmul_onednn.cpp).
        for (int64_t c_padding : {2, 0}) {
          const std::string failure = check_gemm(be, route, ta, tb, c_padding);
          if (!failure.empty()) return failure;
        }
      }
    }
  }
  return "";
}

// host -> device -> device -> host returns every bit (bf16 NaN payloads and signed zeros too).
inline std::string check_copies(Backend& be) {
  std::vector<uint16_t> host(1001);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(i * 40503u);
  const DeviceBuffer first = to_device(be, host, DType::bf16);
  DeviceBuffer second(be, first.numel(), DType::bf16, MemCategory::other);
  copy_buffer(second, first);
  std::vector<uint16_t> back(host.size());
  copy_to_host(back.data(), DType::bf16, static_cast<int64_t>(back.size()), second);
  if (back != host) return "bf16 copy round trip on " + be.name() + " changed the data";
  return "";
}

// A Buffer made in the backend's memory(), as every engine buffer is: charged while it lives,
// zeroed by the space, its bytes reached through the backend's copies.
inline std::string check_buffers(Backend& be) {
  const int other = static_cast<int>(MemCategory::other);
  const size_t before = memory_stats().current[other];
  {
    std::vector<float> host(3001, 1.5f);
    Buffer b(be.memory(), host.size() * sizeof(float), MemCategory::other);
    if (memory_stats().current[other] - before != host.size() * sizeof(float)) {
      return "a Buffer in " + be.name() + "'s memory is not charged";
    }
    be.copy_from_host(b.data(), host.data(), b.bytes());
    b.zero();
    be.copy_to_host(host.data(), b.data(), b.bytes());
    if (std::any_of(host.begin(), host.end(), [](float v) { return v != 0.0f; })) {
      return "Buffer::zero in " + be.name() + "'s memory left a value";
    }
  }
  if (memory_stats().current[other] != before) {
    return "a Buffer in " + be.name() + "'s memory is still charged after its end";
  }
  return "";
}

}  // namespace titan::testing
