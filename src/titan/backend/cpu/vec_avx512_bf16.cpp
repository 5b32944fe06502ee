// The AVX-512 variant with AVX512_BF16 (compile flags in CMakeLists.txt): the avx512 kernels, but
// the bf16 GEMV multiplies with the CPU's bf16 dot product.
#define TITAN_VEC_NS vec_avx512_bf16
#define TITAN_VEC_VARIANT "avx512_bf16"
#include "titan/backend/cpu/vec_impl.inc"
