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

// libgomp (ours and oneDNN's OpenMP runtime) reads OMP_WAIT_POLICY once, as the program loads;
// unset, a thread that reaches a barrier spins up to ~300k iterations before it sleeps. A
// one-token decode step joins ~140 parallel regions, and on a machine shared with other jobs
// those spinning waits hold the cores the descheduled team threads need: decode measured 3-6x
// slower than with OMP_WAIT_POLICY=passive (docs/PERFORMANCE.md, Generation). This re-executes
// the program (/proc/self/exe, the same argv) once with OMP_WAIT_POLICY=passive unless the
// variable is set -- a user's choice wins. It returns when the variable is set, or when exec
// fails (the run then continues with libgomp's default). Call it first thing in main().
void reexec_with_passive_omp_wait(char** argv);

}  // namespace titan
