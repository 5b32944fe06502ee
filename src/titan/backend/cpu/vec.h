// The CPU's tables of the vector primitives (VecKernels, backend/vec_kernels.h): written once
// (vec_impl.inc) and compiled per ISA (scalar, AVX2, AVX-512); the variant is picked at run time
// from the CPU (cpu_info.h). The CPU backend hands vec() to the ops as Backend::vec().
#pragma once

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/vec_kernels.h"

namespace titan {

const VecKernels& vec_kernels(Isa isa);
// The kernels for active_isa().
const VecKernels& vec();

}  // namespace titan
