// The CUDA backend so far: device memory (cudaMalloc, cudaMemcpy), GEMMs through cuBLASLt, the
// device's name, its peak from NVIDIA's datasheets (backend/datasheet_peak.h: a GPU's tensor-core
// rate is not derived from what titan measures, unlike the CPU's; a device not in the table has
// none). titan's CUDA kernels live in ops/cuda/; every vector primitive (the CPU kernels' building
// blocks) throws here.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <type_traits>

#include "titan/backend/cuda/cuda_backend.h"
#include "titan/backend/datasheet_peak.h"
#include "titan/core/error.h"

namespace titan {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  TITAN_CHECK(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}

void check_cublas(cublasStatus_t status, const char* what) {
  TITAN_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what,
              " failed: ", cublasLtGetStatusString(status));
}

cublasOperation_t op(Trans t) {
  return t == Trans::no ? CUBLAS_OP_N : CUBLAS_OP_T;
}

// The largest power of two (at most 256) dividing a pointer's address: what cuBLASLt's heuristic
// may assume of it (an operand can start inside a buffer).
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// C (rows, n at stride ldc, fp32 or bf16 bits) = beta C, one block per row.
__global__ void scale_rows(void* c, bool bf16, int64_t n, int64_t ldc, float beta) {
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t at = static_cast<int64_t>(blockIdx.x) * ldc + j;
    if (!bf16) {
      float* x = static_cast<float*>(c) + at;
      *x = beta == 0.0f ? 0.0f : beta * *x;
    } else {
      // beta is 0 on the bf16 output route (gemm_bf16_to_bf16).
      static_cast<uint16_t*>(c)[at] = 0;
    }
  }
}

// One cuBLASLt matmul, row-major: C (m, n) = alpha op(A) op(B) + beta C. cuBLASLt is column-major:
// a row-major C is the column-major C^T = op(B)^T op(A)^T, so B comes first, with m and n swapped.
// compute CUBLAS_COMPUTE_32F: fp32 arithmetic; fp32 operands use CUBLAS_COMPUTE_32F_FAST_TF32
// instead where training.allow_tf32 asked for it (tf32).
class LtGemm {
 public:
  LtGemm() {
    check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
    check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
  }
  ~LtGemm() {
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  struct Operand {
    const void* data;
    cudaDataType_t type;
    int64_t ld;
  };
  void run(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, Operand a, Operand b,
           float beta, void* c, cudaDataType_t c_type, int64_t ldc, const char* what,
           bool tf32 = false) {
    if (k == 0) {  // no product: C = beta C (cuBLASLt takes no empty operand)
      scale_rows<<<static_cast<unsigned>(m), 256>>>(c, c_type == CUDA_R_16BF, n, ldc, beta);
      check_cuda(cudaGetLastError(), "scale_rows launch");
      return;
    }
    Descriptors d;
    check_cublas(cublasLtMatmulDescCreate(
                     &d.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 what);
    const cublasOperation_t op_first = op(tb), op_second = op(ta);
    check_cublas(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                sizeof op_first),
                 what);
    check_cublas(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                sizeof op_second),
                 what);
    // Column-major shapes as stored: B^T is (n, k) (or (k, n) transposed), A^T (k, m) (or (m, k)).
    check_cublas(cublasLtMatrixLayoutCreate(&d.first, b.type, tb == Trans::no ? n : k,
                                            tb == Trans::no ? k : n, b.ld),
                 what);
    check_cublas(cublasLtMatrixLayoutCreate(&d.second, a.type, ta == Trans::no ? k : m,
                                            ta == Trans::no ? m : k, a.ld),
                 what);
    check_cublas(cublasLtMatrixLayoutCreate(&d.c, c_type, n, m, ldc), what);
    check_cublas(cublasLtMatmulPreferenceCreate(&d.preference), what);
    const size_t workspace = kWorkspaceBytes;
    check_cublas(
        cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof workspace),
        what);
    const uint32_t align_first = alignment_of(b.data), align_second = alignment_of(a.data),
                   align_c = alignment_of(c);
    check_cublas(cublasLtMatmulPreferenceSetAttribute(d.preference,
                                                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &align_first, sizeof align_first),
                 what);
    check_cublas(cublasLtMatmulPreferenceSetAttribute(d.preference,
                                                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &align_second, sizeof align_second),
                 what);
    check_cublas(
        cublasLtMatmulPreferenceSetAttribute(
            d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c),
        what);
    check_cublas(
        cublasLtMatmulPreferenceSetAttribute(
            d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c),
        what);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    check_cublas(cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.first, d.second, d.c, d.c,
                                                d.preference, 1, &heuristic, &found),
                 what);
    TITAN_CHECK(found > 0, "cuBLASLt has no algorithm for ", what, " (m ", m, ", n ", n, ", k ", k,
                ")");
    check_cublas(cublasLtMatmul(handle_, d.op, &alpha, b.data, d.first, a.data, d.second, &beta, c,
                                d.c, c, d.c, &heuristic.algo, workspace_, kWorkspaceBytes, nullptr),
                 what);
  }

 private:
  // cuBLASLt's descriptors of one call, destroyed at its end.
  struct Descriptors {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t first = nullptr, second = nullptr, c = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;
    Descriptors() = default;
    Descriptors(const Descriptors&) = delete;
    Descriptors& operator=(const Descriptors&) = delete;
    ~Descriptors() {
      if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
      if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
      if (second != nullptr) cublasLtMatrixLayoutDestroy(second);
      if (first != nullptr) cublasLtMatrixLayoutDestroy(first);
      if (op != nullptr) cublasLtMatmulDescDestroy(op);
    }
  };
  // NVIDIA's recommendation for Hopper's cuBLASLt kernels.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

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

// Pinned (page-locked) host memory for Buffers staging device tensors: cudaMemcpy to and from it
// runs at the link's rate, without the driver's own bounce through a pinned buffer.
class PinnedHostMemory final : public MemorySpace {
 public:
  const char* name() const override { return "cuda pinned host"; }
  void* reserve(size_t bytes, MemCategory) override {
    if (bytes == 0) return nullptr;
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    TITAN_CHECK(status == cudaSuccess, "cudaHostAlloc of ", bytes,
                " bytes of pinned host memory failed: ", cudaGetErrorString(status));
    return ptr;
  }
  // Called from destructors, so it cannot throw; a failure is reported, not hidden.
  void unreserve(void* ptr, size_t bytes) override {
    const cudaError_t status = cudaFreeHost(ptr);
    if (status != cudaSuccess) {
      std::fprintf(stderr, "titan: cudaFreeHost of %zu bytes failed: %s\n", bytes,
                   cudaGetErrorString(status));
    }
  }
  void release_pages(void*, size_t bytes) override {
    fail("releasing ", bytes, " bytes of pinned host memory at their address is not supported");
  }
  void zero(void* ptr, size_t bytes) override { std::memset(ptr, 0, bytes); }
};

int set_device(int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

class CudaBackend final : public Backend {
 public:
  // The device is set first: the members after it (cuBLASLt's handle and workspace) live on it.
  explicit CudaBackend(int device) : device_(set_device(device)), vec_(missing_vec_kernels()) {
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    memory_bytes_ = prop.totalGlobalMem;
    device_name_ = prop.name;
    capability_ = detail::concat("sm_", prop.major, prop.minor);
    peak_ = datasheet_peak(device_name_, prop.major, prop.minor);
    name_ = detail::concat("cuda:", device_, ": ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                           prop.multiProcessorCount, " SMs, ",
                           static_cast<double>(prop.totalGlobalMem) / (1ull << 30), " GiB)");
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  std::optional<double> peak_gflops(DType dtype) const override {
    if (!peak_) return std::nullopt;
    return datasheet_peak_gflops(*peak_, dtype, allow_tf32_);
  }
  std::string peak_source(DType dtype) const override {
    if (!peak_) {
      return detail::concat("'", device_name_, "' (", capability_,
                            ") is not in titan's table of datasheet peaks, "
                            "src/titan/backend/datasheet_peak.h");
    }
    const std::optional<double> gflops = datasheet_peak_gflops(*peak_, dtype, allow_tf32_);
    if (!gflops) {
      return detail::concat("the ", peak_->source, " row has no ", dtype_name(dtype), " peak");
    }
    const bool tf32 = allow_tf32_ && dtype == DType::f32;
    return detail::concat("the dense ", dtype_name(dtype),
                          tf32 ? " (TF32, training.allow_tf32)" : "", " peak of ", device_name_,
                          ", ", *gflops * 1e-3, " TFLOP/s, from the ", peak_->source);
  }
  // cuBLASLt runs fp32 and bf16 GEMMs on the GPU's own units (tensor cores from sm_80 for bf16).
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
  MemorySpace& host_staging_memory() override { return pinned_; }

  // cuBLASLt (LtGemm): fp32 without TF32, bf16 operands with fp32 accumulation.
  void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) override {
    if (m == 0 || n == 0) return;
    lt_.run(trans_a, trans_b, m, n, k, alpha, {a, CUDA_R_32F, lda}, {b, CUDA_R_32F, ldb}, beta, c,
            CUDA_R_32F, ldc, allow_tf32_ ? "fp32 GEMM (TF32 allowed)" : "fp32 GEMM", allow_tf32_);
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
    lt_.run(trans_a, trans_b, m, n, k, alpha, {a, CUDA_R_16BF, lda}, {b, CUDA_R_16BF, ldb}, beta, c,
            CUDA_R_32F, ldc, "bf16 GEMM (fp32 compute)");
  }
  void gemm_bf16_to_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                         uint16_t* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    lt_.run(trans_a, trans_b, m, n, k, alpha, {a, CUDA_R_16BF, lda}, {b, CUDA_R_16BF, ldb}, 0.0f, c,
            CUDA_R_16BF, ldc, "bf16 GEMM (fp32 compute, bf16 output)");
  }

  const VecKernels& vec() const override { return vec_; }

  void set_allow_tf32(bool allow) { allow_tf32_ = allow; }

 private:
  int device_;
  VecKernels vec_;
  std::string name_;
  size_t memory_bytes_ = 0;
  std::string device_name_, capability_;  // "NVIDIA H200", "sm_90"
  std::optional<DatasheetPeak> peak_;     // empty: not in the table
  bool allow_tf32_ = false;               // training.allow_tf32
  CudaMemory memory_;
  PinnedHostMemory pinned_;
  LtGemm lt_;
};

}  // namespace

void cuda_set_allow_tf32(Backend& cuda, bool allow) {
  auto* backend = dynamic_cast<CudaBackend*>(&cuda);
  TITAN_CHECK(backend != nullptr, "training.allow_tf32: ", cuda.name(), " is not a CUDA backend");
  backend->set_allow_tf32(allow);
}

size_t cuda_device_memory_in_use() {
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

std::unique_ptr<Backend> make_cuda_backend(int ordinal) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  TITAN_CHECK(status == cudaSuccess && count > 0, "no CUDA device (",
              status == cudaSuccess ? "the driver reports none" : cudaGetErrorString(status), ")");
  // (count > 1) in parentheses: clang-format 14 reads `ordinal < count, ..., count > 1` as a
  // template's brackets.
  TITAN_CHECK(ordinal >= 0 && ordinal < count, "no CUDA device ", ordinal, " (the machine has ",
              count, ": cuda:0", (count > 1) ? detail::concat(" to cuda:", count - 1) : "", ")");
  return std::make_unique<CudaBackend>(ordinal);
}

}  // namespace titan
