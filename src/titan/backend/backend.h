// A compute backend: one device's name and kind, its peak FLOP rate, its memory, its threads, its
// GEMMs and its vector primitives. The CPU backend (backend/cpu/cpu_backend.h) implements
// everything; the CUDA backend (backend/cuda/, built with -DTITAN_CUDA=ON) has memory and cuBLAS
// GEMMs so far. Pointers handed to a backend's GEMMs and copies are that backend's memory
// (device_buffer.h).
//
// Everything above the backend layer reaches the hardware through this interface (and the
// backend-level headers beside it: vec_kernels.h, gemm_reference.h, device_buffer.h), never
// through backend/cpu/ or backend/cuda/ (scripts/check-layering.sh refuses such an include). The
// ops in src/titan/ops are the host backend's kernels: they run on the CPU, threaded with OpenMP
// over threads(), and call this interface's GEMMs and vec(); another device's kernels will be
// registered in the kernel registry under their own names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "titan/backend/vec_kernels.h"
#include "titan/core/allocator.h"
#include "titan/core/dtype.h"

namespace titan {

enum class Trans : char { no = 'N', yes = 'T' };

enum class DeviceKind { cpu, cuda };
// "cpu", "cuda".
const char* device_kind_name(DeviceKind kind);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  // One line naming the device: "cpu: AMD EPYC (avx512, 2 threads)".
  virtual std::string name() const = 0;
  // Dense GEMM peak in GFLOP/s with `dtype` operands (fp32 accumulation) on the threads / SMs this
  // process uses: the MFU denominator. Empty where the backend does not know it (a dtype without
  // a peak, or a device whose peak has not been measured yet).
  virtual std::optional<double> peak_gflops(DType dtype) const = 0;
  // Where peak_gflops(dtype) comes from, in one line for a run's log ("the fp32 peak of 2 threads
  // at 118.2 GFLOP/s each: 3.693 GHz x 1 FMA/cycle x 16 lanes x 2; measured now"), or why there
  // is none.
  virtual std::string peak_source(DType dtype) const = 0;
  // Whether GEMMs with `dtype` operands run on instructions made for it; false where they are
  // emulated (bf16 widened to fp32 in registers on a CPU without AVX512_BF16): correct, slower.
  virtual bool native(DType dtype) const = 0;
  // The device's memory in bytes: the machine's RAM on the CPU, global memory on a GPU.
  virtual size_t memory_bytes() const = 0;
  // The CPU threads this backend's host-side work is split over: the OpenMP teams of the host
  // kernels (src/titan/ops) and the GEMM library's. 1 on a device whose kernels run on the device.
  virtual int threads() const = 0;

  // Where the engine's buffers live on this device (core/allocator.h): parameters, gradients,
  // optimizer state, activations and scratch are Buffers in this space, accounted alike.
  virtual MemorySpace& memory() = 0;
  // Raw device memory; `category` is what the CPU's accounted allocator charges it to. Prefer
  // DeviceBuffer, which pairs every allocation with its release.
  virtual void* allocate(size_t bytes, MemCategory category) = 0;
  virtual void release(void* ptr, size_t bytes, MemCategory category) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  // Host memory this device's copies to and from the host are fastest with: pinned (page-locked)
  // on CUDA, host_memory() on the CPU. Where a save stages a device's tensors on their way out.
  virtual MemorySpace& host_staging_memory() = 0;

  // Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n], op(X) = X or X^T, fp32.
  virtual void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                        float* c, int64_t ldc) = 0;
  // The same for one block of a kernel that spreads its own blocks over threads (attention's
  // q k^T and p v): run on the calling thread, without per-call setup a block would notice.
  virtual void gemm_f32_block(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                              float beta, float* c, int64_t ldc) = 0;
  // The same with bf16 A and B (raw bits), products accumulated and C kept in fp32.
  virtual void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                         float* c, int64_t ldc) = 0;
  // bf16 A and B, fp32 accumulation, C written in bf16 (each element rounded to nearest even once)
  // and no beta: for a result only bf16 GEMMs and row-wise fp32 kernels read, at half the bytes.
  virtual void gemm_bf16_to_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
                                 int64_t ldb, uint16_t* c, int64_t ldc) = 0;

  // The row-level vector primitives (vec_kernels.h). A backend without a kernel for one has a
  // function that throws titan::Error naming it. Fetch the table once per op call, outside loops.
  virtual const VecKernels& vec() const = 0;
};

// A device as a job names it (training.device): "cpu", "cuda" (device 0) or "cuda:N".
struct DeviceName {
  DeviceKind kind = DeviceKind::cpu;
  int ordinal = 0;  // the CUDA device's index
};
// The device `name` spells; titan::Error "unknown device '...' (cpu, cuda or cuda:N)" for any
// other text. Needs no device: a config is checked with it before anything is created.
DeviceName parse_device_name(std::string_view name);

// The backend the ops (src/titan/ops) run on: the CPU unless select_backend chose another.
Backend& backend();
// "cpu", "cuda" or "cuda:N" (parse_device_name; each device's backend created on first use):
// titan::Error when the build or the machine has no such device.
Backend& backend_named(std::string_view name);
// Makes backend_named(name) the active backend; call at start-up, before any op runs and before
// anything is allocated. The engine's buffers then come from its memory() and the ops' kernels are
// its device's (dispatch/registry.h). The trainer selects training.device's
// (train/job_device.h); titan_cuda_kernels_test selects CUDA's.
void select_backend(std::string_view name);

}  // namespace titan
