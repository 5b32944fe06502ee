// A device's own count of its memory in use, beside the accounted allocator's categories (which
// count the engine's Buffers on any device): on a GPU it also holds the CUDA context, cuBLASLt's
// workspace, the backend's raw allocations and other processes' memory on the same device.
#pragma once

#include <cstddef>
#include <optional>

#include "titan/backend/backend.h"

namespace titan {

// cudaMemGetInfo's total less free for a CUDA backend (its device being the current one, as
// select_backend leaves it); empty for the CPU, whose memory the categories already cover.
std::optional<size_t> device_memory_in_use(const Backend& device);

}  // namespace titan
