// The ops in src/titan/ops are the host backend's kernels: they run on the CPU, split their work
// over backend().threads() with OpenMP, and reach the GEMMs and vector primitives through
// backend() (backend/backend.h). This is what their OpenMP regions share.
#pragma once

#include <cstdint>

namespace titan {

// Elements below which an elementwise op runs on the calling thread (an OpenMP `if` clause): a
// fork/join costs microseconds, more than such an op, and on a machine shared with other jobs
// every region also waits for its slowest, possibly descheduled, thread. A decode step's
// one-token norms, RoPE and SwiGLU stay under it; training and prefill shapes are far above.
constexpr int64_t kMinParallelElements = int64_t{1} << 14;
// Elements per task of a whole-array op threaded in chunks (bf16 casts, AdamW, residual adds):
// 64 KiB of fp32, enough for a chunk's vector loop to amortise its call, few enough that a
// layer's arrays split evenly over the team and a chunk stays in L1/L2 between two passes.
constexpr int64_t kElementwiseChunk = int64_t{1} << 14;

}  // namespace titan
