#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <vector>

#include "titan/backend/cpu/gemm.h"
#include "titan/core/error.h"

namespace titan {
namespace {

using dnnl::memory;

// (rows, cols) of op(X) in a row-major X with leading dimension ld: a transpose is a swap of
// strides, which the matmul reads in place (no copy; brgemm packs its blocks either way).
memory::desc operand(Trans trans, int64_t rows, int64_t cols, int64_t ld, memory::data_type t) {
  const memory::dims strides = trans == Trans::no ? memory::dims{ld, 1} : memory::dims{1, ld};
  return memory::desc({rows, cols}, t, strides);
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One stream per thread: the experts' threads each run their own matmuls at once, and a stream
// is not documented as safe to share between threads that execute on it concurrently.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// A and B of type `operands`, C of type `result`.
dnnl::matmul::primitive_desc matmul_desc(memory::data_type operands, memory::data_type result,
                                         Trans trans_a, Trans trans_b, int64_t m, int64_t n,
                                         int64_t k, float alpha, int64_t lda, int64_t ldb,
                                         float beta, int64_t ldc) {
  const memory::desc a_md = operand(trans_a, m, k, lda, operands);
  const memory::desc b_md = operand(trans_b, k, n, ldb, operands);
  const memory::desc c_md = operand(Trans::no, m, n, ldc, result);
  // alpha scales the product; beta is a sum post-op (C = alpha * A B + beta * C).
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  return {dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine()};
}

// Everything that defines one matmul call but its pointers.
struct MatmulKey {
  memory::data_type operands, result;
  Trans trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alpha_bits, beta_bits;
  bool operator==(const MatmulKey&) const = default;
};

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const {
    size_t h = 0;
    const auto mix = [&h](uint64_t v) { h = h * 0x100000001b3ull ^ std::hash<uint64_t>{}(v); };
    mix(static_cast<uint64_t>(key.operands) << 8 | static_cast<uint64_t>(key.result));
    mix(static_cast<uint64_t>(key.trans_a) << 1 | static_cast<uint64_t>(key.trans_b));
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc})
      mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.alpha_bits) << 32 | key.beta_bits);
    return h;
  }
};

// oneDNN 2.6's brgemm matmul (AVX512_BF16 or AMX) reads only operands whose rows are dense; given
// a strided one (attention's key and value blocks, rows of all kv heads apart) it falls back to
// gemm:jit, which ran bf16 attention's 256 x 128 x 128 blocks at 77 GFLOP/s inside the step on a
// Sapphire Rapids, where AMX runs them densely at 800-1000. Such an operand, if small, is copied
// dense first. A large one is left to gemm:jit, which packs it itself: the lm_head loss's d logits
// (rows padded to an odd number of cache lines, 155 MB) ran there at 1000-1300 GFLOP/s and at
// 600-900 through brgemm after a copy.
constexpr int64_t kMaxDensifiedBytes = int64_t{1} << 20;

struct CachedMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  bool dense_a = false, dense_b = false;  // copy the operand to rows ld = its width first
};

bool is_brgemm(const dnnl::matmul::primitive_desc& pd) {
  return std::strncmp(pd.impl_info_str(), "brg", 3) == 0;
}

// The leading dimension of op(X) (rows x cols) stored densely.
int64_t dense_ld(Trans trans, int64_t rows, int64_t cols) {
  return trans == Trans::no ? cols : rows;
}

// The matmuls this thread has run, by shape: building the descriptor and fetching the primitive
// from oneDNN's cache costs 4-6 us a call (measured on a Zen 4), a fifth of one of attention's
// 256 x 128 x 128 bf16 block products, and a step repeats a few hundred shapes. Per thread, as
// each primitive must run on the thread that made it (see matmul); emptied when it outgrows
// kMaxCachedMatmuls (ever-new shapes: prefill chunks of every length).
constexpr size_t kMaxCachedMatmuls = 512;

const CachedMatmul& cached_matmul(const MatmulKey& key) {
  thread_local std::unordered_map<MatmulKey, CachedMatmul, MatmulKeyHash> cache;
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedMatmuls) cache.clear();
  const float alpha = std::bit_cast<float>(key.alpha_bits),
              beta = std::bit_cast<float>(key.beta_bits);
  const auto build = [&](int64_t lda, int64_t ldb) {
    return matmul_desc(key.operands, key.result, key.trans_a, key.trans_b, key.m, key.n, key.k,
                       alpha, lda, ldb, beta, key.ldc);
  };
  CachedMatmul mm{build(key.lda, key.ldb), {}};
  const int64_t lda = dense_ld(key.trans_a, key.m, key.k),
                ldb = dense_ld(key.trans_b, key.k, key.n);
  const int64_t element = static_cast<int64_t>(memory::data_type_size(key.operands));
  const bool small = std::max(key.m, key.n) * key.k * element <= kMaxDensifiedBytes;
  if (!is_brgemm(mm.pd) && small && (key.lda != lda || key.ldb != ldb)) {
    auto dense = build(lda, ldb);
    if (is_brgemm(dense)) {
      mm.pd = std::move(dense);
      mm.dense_a = key.lda != lda;
      mm.dense_b = key.ldb != ldb;
    }
  }
  mm.primitive = dnnl::matmul(mm.pd);
  return cache.emplace(key, std::move(mm)).first->second;
}

// op(X)'s storage (rows x cols of op(X), ld apart) copied to rows dense_ld apart, in `buffer`.
const void* densified(std::vector<std::byte>& buffer, Trans trans, int64_t rows, int64_t cols,
                      const void* x, int64_t ld, size_t element) {
  const int64_t stored_rows = trans == Trans::no ? rows : cols, width = dense_ld(trans, rows, cols);
  buffer.resize(static_cast<size_t>(stored_rows * width) * element);
  const auto* from = static_cast<const std::byte*>(x);
  for (int64_t r = 0; r < stored_rows; ++r) {
    std::memcpy(buffer.data() + r * width * element, from + r * ld * element, width * element);
  }
  return buffer.data();
}

const char* type_name(memory::data_type t) {
  return t == memory::data_type::bf16 ? "bf16" : "fp32";
}

void matmul(memory::data_type operands, memory::data_type result, Trans trans_a, Trans trans_b,
            int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda, const void* b,
            int64_t ldb, float beta, void* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl::engine& engine = cpu_engine();
  dnnl::stream& stream = thread_stream();
  try {
    // Threads of a parallel region may call this at once: oneDNN's default (library) scratchpad
    // allows primitives made and run in parallel as long as each runs on the thread that made it,
    // as the per-thread cache's do.
    const CachedMatmul& mm =
        cached_matmul({operands, result, trans_a, trans_b, m, n, k, lda, ldb, ldc,
                       std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)});
    const size_t element = memory::data_type_size(operands);
    thread_local std::vector<std::byte> dense_a, dense_b;
    if (mm.dense_a) a = densified(dense_a, trans_a, m, k, a, lda, element);
    if (mm.dense_b) b = densified(dense_b, trans_b, k, n, b, ldb, element);
    // oneDNN takes non-const handles; the matmul only reads its source and weights.
    memory a_mem(mm.pd.src_desc(), engine, const_cast<void*>(a));
    memory b_mem(mm.pd.weights_desc(), engine, const_cast<void*>(b));
    memory c_mem(mm.pd.dst_desc(), engine, c);
    mm.primitive.execute(stream,
                         {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
  } catch (const dnnl::error& err) {
    fail("oneDNN ", type_name(operands), " matmul to ", type_name(result), " failed (", err.what(),
         ") for m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
  }
}

std::string matmul_implementation(memory::data_type operands) {
  const dnnl::version_t* v = dnnl::version();
  // The linear forward's shape (x W^T), the one gemm_f32 sends to the matmul.
  const auto pd = matmul_desc(operands, memory::data_type::f32, Trans::no, Trans::yes, 256, 256,
                              256, 1.0f, 256, 256, 0.0f, 256);
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " matmul " + pd.impl_info_str();
}

}  // namespace

void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  // oneDNN 2.6's sgemm is weak on x W^T with few rows (half the matmul's rate at 128 rows, a
  // quarter at an expert's 40) and level or better on every other pair, by up to 1.3x on the
  // lm_head backward (docs/GEMM.md). Called inside a parallel region (the experts, one per thread)
  // the matmul runs on the calling thread.
  if (trans_a == Trans::no && trans_b == Trans::yes) {
    matmul_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

void matmul_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  matmul(memory::data_type::f32, memory::data_type::f32, trans_a, trans_b, m, n, k, alpha, a, lda,
         b, ldb, beta, c, ldc);
}

void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  matmul(memory::data_type::bf16, memory::data_type::f32, trans_a, trans_b, m, n, k, alpha, a, lda,
         b, ldb, beta, c, ldc);
}

void gemm_bf16_to_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* c,
                       int64_t ldc) {
  matmul(memory::data_type::bf16, memory::data_type::bf16, trans_a, trans_b, m, n, k, alpha, a, lda,
         b, ldb, 0.0f, c, ldc);
}

std::string gemm_library_name() {
  return matmul_implementation(memory::data_type::f32) + " for x W^T, sgemm for the other pairs";
}

std::string gemm_bf16_library_name() {
  return matmul_implementation(memory::data_type::bf16);
}

}  // namespace titan
