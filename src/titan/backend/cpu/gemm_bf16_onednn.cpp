#include <oneapi/dnnl/dnnl.hpp>

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

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

Engine& cpu_engine() {
  static Engine e;
  return e;
}

dnnl::matmul::primitive_desc matmul_desc(Trans trans_a, Trans trans_b, int64_t m, int64_t n,
                                         int64_t k, float alpha, int64_t lda, int64_t ldb,
                                         float beta, int64_t ldc) {
  const memory::desc a_md = operand(trans_a, m, k, lda, memory::data_type::bf16);
  const memory::desc b_md = operand(trans_b, k, n, ldb, memory::data_type::bf16);
  const memory::desc c_md = operand(Trans::no, m, n, ldc, memory::data_type::f32);
  // alpha scales the product; beta is a sum post-op (C = alpha * A B + beta * C).
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  return {dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine().engine};
}

}  // namespace

void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (m == 0 || n == 0) return;
  Engine& e = cpu_engine();
  try {
    // Creating the descriptor costs ~10-20 us; the primitive itself comes from oneDNN's primitive
    // cache (1024 entries by default) after the first call with a shape.
    const auto pd = matmul_desc(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc);
    const dnnl::matmul matmul(pd);
    // oneDNN takes non-const handles; the matmul only reads its source and weights.
    memory a_mem(pd.src_desc(), e.engine, const_cast<uint16_t*>(a));
    memory b_mem(pd.weights_desc(), e.engine, const_cast<uint16_t*>(b));
    memory c_mem(pd.dst_desc(), e.engine, c);
    matmul.execute(e.stream,
                   {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    e.stream.wait();
  } catch (const dnnl::error& err) {
    fail("oneDNN bf16 matmul failed (", err.what(), ") for m=", m, " n=", n, " k=", k, " lda=", lda,
         " ldb=", ldb, " ldc=", ldc);
  }
}

std::string gemm_bf16_library_name() {
  const dnnl::version_t* v = dnnl::version();
  // The linear forward's shape (x W^T); every transpose pair dispatches alike on AVX512_BF16.
  const auto pd = matmul_desc(Trans::no, Trans::yes, 256, 256, 256, 1.0f, 256, 256, 0.0f, 256);
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " matmul " + pd.impl_info_str();
}

}  // namespace titan
