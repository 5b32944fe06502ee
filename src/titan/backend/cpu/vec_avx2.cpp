// The avx2 variant of the vector primitives (compile flags in CMakeLists.txt).
#define TITAN_VEC_NS vec_avx2
#define TITAN_VEC_VARIANT "avx2"
#include "titan/backend/cpu/vec_impl.inc"
