// The engine's thread count: OpenMP for our kernels, the same count for the GEMM library.
#pragma once

#include <cstdint>

namespace titan {

// Default: the physical core count (hyper-threads slow GEMM down more than they help).
int default_thread_count();
// n >= 1, else titan::Error.
void set_thread_count(int n);
int thread_count();

// libgomp (ours and oneDNN's OpenMP runtime) reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, as
// the program loads. Unset, a thread that reaches a barrier or the end of a region spins ~300k
// iterations (a few ms) before it sleeps; OMP_WAIT_POLICY=passive alone sleeps at once. A
// one-token decode step joins ~140 parallel regions a few hundred microseconds apart:
//  - spinning for milliseconds, on a machine shared with other jobs, holds the cores the
//    descheduled team threads need (decode 3-6x slower than passive, docs/PERFORMANCE.md);
//  - sleeping at once makes every region start with a futex wake-up of each team thread, tens of
//    microseconds on this VM: a bf16 step took 40-41 ms passive and 37-38 ms with a short spin,
//    and 31 ms against 26 ms when the VM gave twice the memory bandwidth.
// Training too: with other processes on the cores, the default spin made 40 steps of the default
// model at --threads 2 take 136-173 s against 29-32 s with the short spin (docs/PERFORMANCE.md).
// So this re-executes the program (/proc/self/exe, the same argv) once with
// OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=kDecodeSpinCount (~10 us of spinning at libgomp's
// estimate of 100k spins per ms; passive also turns the spin off when there are more threads
// than CPUs), unless either variable is set -- a user's choice wins. It returns when one is set,
// or when exec fails (the run then continues with libgomp's defaults). Call it first in main().
inline constexpr const char* kDecodeSpinCount = "1000";
void reexec_with_short_omp_spin(char** argv);

}  // namespace titan
