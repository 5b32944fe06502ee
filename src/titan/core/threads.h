// The engine's thread count: OpenMP for our kernels, the same count for the GEMM library.
#pragma once

#include <cstdint>

namespace titan {

// Elements below which an elementwise op runs on the calling thread (an OpenMP `if` clause): a
// fork/join costs microseconds, more than such an op, and on a machine shared with other jobs
// every region also waits for its slowest, possibly descheduled, thread. A decode step's
// one-token norms, RoPE and SwiGLU stay under it; training and prefill shapes are far above.
constexpr int64_t kMinParallelElements = int64_t{1} << 14;

// Default: the physical core count (hyper-threads slow GEMM down more than they help).
int default_thread_count();
// n >= 1, else titan::Error.
void set_thread_count(int n);
int thread_count();

}  // namespace titan
