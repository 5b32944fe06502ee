// The CPU backend: host memory from the accounted allocator (core/allocator.h), oneDNN GEMMs
// (gemm.h), the vector primitives of the active ISA (vec.h), the measured peak (peak.h).
#pragma once

#include "titan/backend/backend.h"

namespace titan {

// The process's one CPU backend.
Backend& cpu_backend();

}  // namespace titan
