// The CUDA backend, built with -DTITAN_CUDA=ON (cuda_backend.cu); a build without it links
// no_cuda.cpp, whose make_cuda_backend says so.
#pragma once

#include <cstddef>
#include <memory>

#include "titan/backend/backend.h"

namespace titan {

// The backend of CUDA device `ordinal`. titan::Error "no CUDA device (...)" when the machine has
// none (or no driver), "no CUDA device N (...)" when it has fewer, "this titan was built without
// CUDA (...)" in a build without the backend.
std::unique_ptr<Backend> make_cuda_backend(int ordinal = 0);

// Bytes of the current CUDA device's memory in use (cudaMemGetInfo's total less free); titan::Error
// in a build without CUDA.
size_t cuda_device_memory_in_use();

// training.allow_tf32 on a CUDA backend (backend/allow_tf32.h); titan::Error in a build without
// CUDA.
void cuda_set_allow_tf32(Backend& cuda, bool allow);

}  // namespace titan
