// The CUDA backend, built with -DTITAN_CUDA=ON (cuda_backend.cu); a build without it links
// no_cuda.cpp, whose make_cuda_backend says so.
#pragma once

#include <memory>

#include "titan/backend/backend.h"

namespace titan {

// The backend of CUDA device 0. titan::Error "no CUDA device (...)" when the machine has none
// (or no driver), "this titan was built without CUDA (...)" in a build without the backend.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace titan
