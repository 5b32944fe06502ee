// The scalar variant of the vector primitives (compile flags in CMakeLists.txt).
#define TITAN_VEC_NS vec_scalar
#define TITAN_VEC_VARIANT "scalar"
#include "titan/backend/cpu/vec_impl.inc"
