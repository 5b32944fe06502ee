// The avx512 variant of the vector primitives (compile flags in CMakeLists.txt).
#define TITAN_VEC_NS vec_avx512
#define TITAN_VEC_VARIANT "avx512"
#include "titan/backend/cpu/vec_impl.inc"
