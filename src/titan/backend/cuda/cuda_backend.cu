// The CUDA backend so far: device memory (cudaMalloc, cudaMemcpy), GEMMs through cuBLAS, the
// device's name. No titan kernels run on it yet: every vector primitive throws, and the peak is
// unknown until measured (a GPU's per-SM rate depends on its architecture and tensor cores;
// titan reports only rates it has measured or derived from measured quantities, as the CPU's).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdio>
#include <type_traits>

#include "titan/backend/cuda/cuda_backend.h"
#include "titan/core/error.h"

namespace titan {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  TITAN_CHECK(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}

void check_cublas(cublasStatus_t status, const char* what) {
  TITAN_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS ", what,
              " failed: ", cublasGetStatusString(status));
}

// cuBLAS takes int dimensions.
int to_int(int64_t v, const char* what) {
  TITAN_CHECK(v >= 0 && v <= INT_MAX, "cuBLAS GEMM ", what, " = ", v, " does not fit an int");
  return static_cast<int>(v);
}

cublasOperation_t op(Trans t) {
  return t == Trans::no ? CUBLAS_OP_N : CUBLAS_OP_T;
}

template <typename F>
struct ReturnOf;
template <typename R, typename... A>
struct ReturnOf<R (*)(A...)> {
  using type = R;
};

[[noreturn]] void vec_missing(const char* name) {
  fail("vector primitive '", name, "' is not implemented on CUDA yet");
}

// VecKernels' layout as of this list: variant, 22 primitives, native_lanes, fma_chains. A member
// left out below would be a null pointer, so a changed struct stops the build here instead.
static_assert(sizeof(VecKernels) == sizeof(const char*) + 22 * sizeof(void*) + 8 + sizeof(void*),
              "VecKernels changed: give every new primitive a TITAN_CUDA_MISSING line below, then "
              "update this size");

// Every primitive of VecKernels, each throwing with its own name.
#define TITAN_CUDA_MISSING(member) \
  k.member = [](auto...) -> ReturnOf<decltype(VecKernels::member)>::type { vec_missing(#member); }

VecKernels missing_vec_kernels() {
  VecKernels k{};
  k.variant = "cuda";
  k.native_lanes = 0;
  TITAN_CUDA_MISSING(max);
  TITAN_CUDA_MISSING(exp_shift_sum);
  TITAN_CUDA_MISSING(max_bf16);
  TITAN_CUDA_MISSING(exp_shift_sum_bf16);
  TITAN_CUDA_MISSING(sum_squares);
  TITAN_CUDA_MISSING(dot);
  TITAN_CUDA_MISSING(scale);
  TITAN_CUDA_MISSING(axpy);
  TITAN_CUDA_MISSING(scale_mul);
  TITAN_CUDA_MISSING(silu_mul);
  TITAN_CUDA_MISSING(silu_mul_backward);
  TITAN_CUDA_MISSING(adamw);
  TITAN_CUDA_MISSING(round_to_bf16);
  TITAN_CUDA_MISSING(widen_bf16);
  TITAN_CUDA_MISSING(gemv_f32);
  TITAN_CUDA_MISSING(gemv_bf16);
  TITAN_CUDA_MISSING(axpy_bf16);
  TITAN_CUDA_MISSING(axpy_rows);
  TITAN_CUDA_MISSING(gqa_scores_f32);
  TITAN_CUDA_MISSING(gqa_scores_bf16);
  TITAN_CUDA_MISSING(gqa_values_f32);
  TITAN_CUDA_MISSING(gqa_values_bf16);
  TITAN_CUDA_MISSING(fma_chains);
  return k;
}
#undef TITAN_CUDA_MISSING

// Device memory for Buffers: cudaMalloc'd, zeroed by cudaMemset.
class CudaMemory final : public MemorySpace {
 public:
  const char* name() const override { return "cuda"; }
  void* reserve(size_t bytes, MemCategory) override {
    if (bytes == 0) return nullptr;
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    TITAN_CHECK(status == cudaSuccess, "out of CUDA memory: cudaMalloc of ", bytes,
                " bytes failed: ", cudaGetErrorString(status));
    return ptr;
  }
  // Called from destructors, so it cannot throw; a failure is reported, not hidden.
  void unreserve(void* ptr, size_t bytes) override {
    const cudaError_t status = cudaFree(ptr);
    if (status != cudaSuccess) {
      std::fprintf(stderr, "titan: cudaFree of %zu bytes failed: %s\n", bytes,
                   cudaGetErrorString(status));
    }
  }
  // Handing pages back at a kept address needs CUDA's virtual memory management (cuMemMap), which
  // this backend does not use yet.
  void release_pages(void*, size_t bytes) override {
    fail("releasing ", bytes,
         " bytes of a Buffer's device memory at its address (FSDP's units "
         "between uses) is not implemented on CUDA yet");
  }
  void zero(void* ptr, size_t bytes) override {
    check_cuda(cudaMemset(ptr, 0, bytes), "cudaMemset");
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), vec_(missing_vec_kernels()) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    memory_bytes_ = prop.totalGlobalMem;
    name_ = detail::concat("cuda:", device_, ": ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                           prop.multiProcessorCount, " SMs, ",
                           static_cast<double>(prop.totalGlobalMem) / (1ull << 30), " GiB)");
    check_cublas(cublasCreate(&cublas_), "cublasCreate");
  }
  ~CudaBackend() override { cublasDestroy(cublas_); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  std::optional<double> peak_gflops(DType) const override { return std::nullopt; }
  std::string peak_source(DType) const override { return "no peak on CUDA yet: not measured"; }
  // cuBLAS runs fp32 and bf16 GEMMs on the GPU's own units (tensor cores from sm_80 for bf16).
  bool native(DType dtype) const override { return dtype == DType::f32 || dtype == DType::bf16; }
  size_t memory_bytes() const override { return memory_bytes_; }
  // The kernels run on the device; the host only launches them.
  int threads() const override { return 1; }

  MemorySpace& memory() override { return memory_; }
  // Device memory is not charged to the host's memory categories.
  void* allocate(size_t bytes, MemCategory) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    TITAN_CHECK(status == cudaSuccess, "out of CUDA memory: cudaMalloc of ", bytes, " bytes on ",
                name_, " failed: ", cudaGetErrorString(status));
    return ptr;
  }
  // Called from destructors, so it cannot throw; a failure is reported, not hidden.
  void release(void* ptr, size_t bytes, MemCategory) override {
    const cudaError_t status = cudaFree(ptr);
    if (status != cudaSuccess) {
      std::fprintf(stderr, "titan: cudaFree of %zu bytes failed: %s\n", bytes,
                   cudaGetErrorString(status));
    }
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    check_cuda(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice), "copy host to device");
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    check_cuda(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost), "copy device to host");
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy device to device");
  }

  // cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
  // the same call with A and B (and m and n) swapped.
  void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) override {
    if (m == 0 || n == 0) return;
    check_cublas(cublasSgemm(cublas_, op(trans_b), op(trans_a), to_int(n, "n"), to_int(m, "m"),
                             to_int(k, "k"), &alpha, b, to_int(ldb, "ldb"), a, to_int(lda, "lda"),
                             &beta, c, to_int(ldc, "ldc")),
                 "cublasSgemm");
  }
  // A block is a small GEMM on the stream like any other.
  void gemm_f32_block(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) override {
    gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    check_cublas(cublasGemmEx(cublas_, op(trans_b), op(trans_a), to_int(n, "n"), to_int(m, "m"),
                              to_int(k, "k"), &alpha, b, CUDA_R_16BF, to_int(ldb, "ldb"), a,
                              CUDA_R_16BF, to_int(lda, "lda"), &beta, c, CUDA_R_32F,
                              to_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (bf16 inputs, fp32 compute)");
  }
  void gemm_bf16_to_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                         uint16_t* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    const float beta = 0.0f;
    check_cublas(cublasGemmEx(cublas_, op(trans_b), op(trans_a), to_int(n, "n"), to_int(m, "m"),
                              to_int(k, "k"), &alpha, b, CUDA_R_16BF, to_int(ldb, "ldb"), a,
                              CUDA_R_16BF, to_int(lda, "lda"), &beta, c, CUDA_R_16BF,
                              to_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (bf16 inputs, fp32 compute, bf16 output)");
  }

  const VecKernels& vec() const override { return vec_; }

 private:
  int device_;
  VecKernels vec_;
  std::string name_;
  size_t memory_bytes_ = 0;
  cublasHandle_t cublas_ = nullptr;
  CudaMemory memory_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  TITAN_CHECK(status == cudaSuccess && count > 0, "no CUDA device (",
              status == cudaSuccess ? "the driver reports none" : cudaGetErrorString(status), ")");
  return std::make_unique<CudaBackend>(0);
}

}  // namespace titan
