// The engine's thread count: OpenMP for our kernels, the same count for the GEMM library.
#pragma once

namespace titan {

// Default: the physical core count (hyper-threads slow GEMM down more than they help).
int default_thread_count();
// n >= 1, else titan::Error.
void set_thread_count(int n);
int thread_count();

}  // namespace titan
