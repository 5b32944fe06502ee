// What a CUDA kernel's per-element or per-row body needs to be compiled twice: for the device by
// nvcc (a .cu file in this folder) and for the host by the plain C++ compiler (the unit test
// cuda_rows, which runs the same body on the CPU against the CPU op's reference, so the indexing
// is checked without a GPU). No CUDA header is included here.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TITAN_HD __host__ __device__
#else
#define TITAN_HD
#endif

namespace titan::cuda_rows {

// fp32 <-> bf16 bits, the same arithmetic as core/dtype.h's f32_to_bf16 (to nearest, ties to
// even, NaN kept quiet) and bf16_to_f32 (exact).
TITAN_HD inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

TITAN_HD inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The team a row body is split over: on the device a thread block (team.cuh's BlockTeam), on the
// host one thread. A body's thread handles the elements rank, rank + size, ...; sum and max
// return the team's total to every member; sync is a barrier.
struct HostTeam {
  int rank() const { return 0; }
  int size() const { return 1; }
  void sync() const {}
  float sum(float v) const { return v; }
  double sum(double v) const { return v; }
  float max(float v) const { return v; }
};

}  // namespace titan::cuda_rows
